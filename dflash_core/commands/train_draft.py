"""train-draft: train a DFlash draft for an mlx-lm target on the target's own continuations."""
import json
import sys
from pathlib import Path

from .. import train_draft
from ..errors import DFlashError
from ..loading import resolve
from ..model_card import draft_card


def add_parser(sub):
    p = sub.add_parser("train-draft", help="train a DFlash draft for an mlx-lm target")
    train_draft.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    args.target = str(resolve(args.target, "target"))  # a local directory or a hub id
    if not (Path(args.target) / "config.json").is_file():
        raise DFlashError(f"--target '{args.target}' is not an mlx-lm model directory (no config.json)")
    if not 2 <= args.block_size <= 64:
        raise DFlashError(f"--block-size {args.block_size} is out of range: use 2..64")
    summary = train_draft.train(args, log=lambda m: print(m, flush=True))
    summary["command"] = "python -m dflash_core train-draft " + " ".join(_own_argv())
    out = Path(args.out)
    (out / "training.json").write_text(json.dumps(summary, indent=1))
    (out / "README.md").write_text(draft_card(summary))
    print(f"wrote {out}: engine tokens per cycle {summary['eval_tau']}")
    return 0


def _own_argv() -> list:
    """This command's own arguments, whether run through the CLI or as a module."""
    argv = sys.argv[1:]
    return argv[argv.index("train-draft") + 1 :] if "train-draft" in argv else argv


if __name__ == "__main__":  # without the CLI's other commands (e.g. on a bare GPU machine)
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dflash_core.commands.train_draft")
    train_draft.add_arguments(parser)
    sys.exit(run(parser.parse_args()))
