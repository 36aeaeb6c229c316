"""train-target: train a small target model + tokenizer from scratch on the Python stdlib."""

import platform
import time

from ..training import train_target
from ..training.model_card import target_card
from .common import run_standalone, save_training_record


def add_parser(sub):
    p = sub.add_parser("train-target", help="train a small target model on the Python standard library")
    train_target.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    summary = train_target.train(args, log=lambda m: print(m, flush=True))
    summary["python"] = platform.python_version()
    summary["started"] = started
    save_training_record(args.out, "train-target", summary, target_card)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_standalone("dflash_core.commands.train_target", train_target.add_arguments, run)
