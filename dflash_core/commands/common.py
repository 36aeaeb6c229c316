"""Arguments and helpers shared by the commands that load a model pair."""
import sys

from ..loading import load_pair


def add_pair_args(p):
    p.add_argument("--model", help="target: local mlx-lm dir, hub id, or a shipped pair's name (default: the shipped pair)")
    p.add_argument("--draft", help="DFlash draft: local dir or hub id (default: the registry's draft for --model)")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def load(args):
    log(f"loading {args.model or 'the shipped default pair'} ...")
    return load_pair(args.model, args.draft)


def positive_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
