"""`models`: the targets with a known draft and what each weighs. Sizes come from the cache for what
is downloaded, from the hub's file listing for the rest (nothing is downloaded), and are unknown
offline for what is not in the cache. Each pair names its architecture and whether DFlash serves it;
a hub id no public source confirmed is marked so."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..engine.target import SUPPORTED_ARCHITECTURES
from ..models.hub import RepoSize, local_size, size
from ..models.memory import gb
from ..models.registry import SHIPPED, known_pairs


def add_parser(sub):
    p = sub.add_parser(
        "models",
        help="list the known target -> draft pairs and their download sizes",
        description="List the known target -> draft pairs with their download sizes (from the "
        "Hugging Face cache, else the hub's file listing; HF_HUB_OFFLINE=1 asks only the "
        "cache). Other quantized conversions of a base (e.g. mlx-community/Qwen3-4B-8bit) "
        "resolve to its draft too.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _on_disk(path: Path) -> RepoSize:
    if not path.exists():  # SmolLM2's GGUF before scripts/install.sh
        return RepoSize(str(path), None, None, "missing")
    return RepoSize(str(path), local_size(path), 0, "disk")


def _text(s: RepoSize) -> str:
    if s.source == "missing":
        return "not here: run scripts/install.sh"
    return f"{gb(s.total)} on disk" if s.source == "disk" else s.text()


def run(args) -> int:
    pairs = known_pairs()
    repos = sorted({r for p in pairs if p.kind != "shipped" for r in (p.target, p.draft)})
    with ThreadPoolExecutor(8) as pool:  # one listing request per repository, at once
        sizes = dict(zip(repos, pool.map(size, repos)))
    for name, (target, draft) in SHIPPED.items():
        sizes[name], sizes[str(draft)] = _on_disk(target), _on_disk(draft)
    rows = [
        {
            "base": p.base,
            "target": p.target,
            "draft": p.draft,
            "kind": p.kind,
            "family": p.family,
            "supported": p.family in SUPPORTED_ARCHITECTURES,
            "gated": p.gated,
            "unconfirmed": p.unconfirmed,
            "target_size": vars(sizes[p.target]),
            "draft_size": vars(sizes[p.draft]),
        }
        for p in pairs
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("base", "family", "kind", "target", "target size", "draft", "draft size")]
    table += [
        (
            r["base"],
            r["family"] + ("" if r["supported"] else " (not supported)"),
            r["kind"] + (" (gated)" if r["gated"] else "") + (" (name unconfirmed)" if r["unconfirmed"] else ""),
            r["target"],
            _text(sizes[r["target"]]),
            r["draft"],
            _text(sizes[r["draft"]]),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)) + "  " + row[-1])
    return 0
