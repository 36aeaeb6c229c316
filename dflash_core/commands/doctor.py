"""doctor: what MLX, device, BLAS, memory and Hugging Face cache this machine uses, and the
process group under mlx.launch."""

import json

from .. import backend
from ..engine.prefix_cache import DEFAULT_PREFIX_CACHE_MB
from ..models import distributed, memory


def add_parser(sub):
    p = sub.add_parser("doctor", help="show MLX version, device, BLAS, memory, HF cache and offline state")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    info = {**backend.describe(), "group": distributed.describe()}
    if args.json:
        m = memory.device_memory()
        print(
            json.dumps(
                {
                    **info,
                    "memory_bytes": m["memory"],
                    "working_set_bytes": m["working_set"],
                    "working_set_source": m["source"],
                    "prefix_cache_mb": DEFAULT_PREFIX_CACHE_MB,
                }
            )
        )
    else:
        rows = {**info, "group": _group_text(info["group"]), **memory.describe(), "prefix_cache": _prefix_cache_text()}
        for k, v in rows.items():
            print(f"{k:>12}: {v}")
    return 0


def _prefix_cache_text() -> str:
    share = DEFAULT_PREFIX_CACHE_MB * 2**20 / memory.device_memory()["working_set"]
    return (
        f"serve keeps up to {DEFAULT_PREFIX_CACHE_MB} MB of prompt snapshots ({share:.1%} of the working set); "
        "serve --prefix-cache-mb sets it, 0 turns it off"
    )


def _group_text(group: dict) -> str:
    if group["backend"] is None:
        return "one process (mlx.launch starts a group of several)"
    return f"{group['size']} processes, {group['backend']} backend; this is rank {group['rank']}"
