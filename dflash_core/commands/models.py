"""`models`: the targets with a known draft, offline (nothing is downloaded)."""
import json
from pathlib import Path

from ..registry import known_pairs


def add_parser(sub):
    p = sub.add_parser("models", help="list the known target -> draft pairs",
                       description="List the known target -> draft pairs. Quantized conversions of a "
                                   "base (e.g. mlx-community/Qwen3-4B-4bit) resolve to its draft.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _downloaded(repo: str) -> bool:
    """Whether the hub cache already holds this repo's config (no network)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo, "config.json"), str)


def run(args) -> int:
    rows = []
    for target, draft, kind in known_pairs():
        have = _downloaded(draft) if kind == "hub" else Path(draft).is_dir()
        rows.append({"target": target, "draft": draft, "kind": kind, "draft_local": have})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["target"]) for r in rows)
    print(f"{'target':<{width}}  {'kind':<7}  {'local':<6}  draft")
    for r in rows:
        print(f"{r['target']:<{width}}  {r['kind']:<7}  {'yes' if r['draft_local'] else 'no':<6}  {r['draft']}")
    return 0
