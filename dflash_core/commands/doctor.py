"""doctor: what MLX, device, BLAS and Hugging Face cache this machine uses."""
import json

from .. import backend


def add_parser(sub):
    p = sub.add_parser("doctor", help="show MLX version, device, BLAS, HF cache and offline state")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    info = backend.describe()
    if args.json:
        print(json.dumps(info))
    else:
        for k, v in info.items():
            print(f"{k:>10}: {v}")
    return 0
