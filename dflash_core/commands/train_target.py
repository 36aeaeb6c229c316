"""train-target: train a small target model + tokenizer from scratch on the Python stdlib."""
import json
import platform
import sys
import time
from pathlib import Path

from .. import train_target
from ..model_card import target_card


def add_parser(sub):
    p = sub.add_parser("train-target", help="train a small target model on the Python standard library")
    train_target.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    summary = train_target.train(args, log=lambda m: print(m, flush=True))
    summary["command"] = "python -m dflash_core train-target " + " ".join(_own_argv())
    summary["python"] = platform.python_version()
    summary["started"] = started
    out = Path(args.out)
    (out / "training.json").write_text(json.dumps(summary, indent=1))
    (out / "README.md").write_text(target_card(summary))
    print(f"wrote {out}")
    return 0


def _own_argv() -> list:
    """This command's own arguments, whether run through the CLI or as a module."""
    argv = sys.argv[1:]
    return argv[argv.index("train-target") + 1 :] if "train-target" in argv else argv


if __name__ == "__main__":  # without the CLI's other commands (e.g. on a bare GPU machine)
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dflash_core.commands.train_target")
    train_target.add_arguments(parser)
    sys.exit(run(parser.parse_args()))
