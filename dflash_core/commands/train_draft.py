"""train-draft: train a DFlash draft for an mlx-lm target on the target's own continuations."""

from pathlib import Path

from ..errors import DFlashError
from ..models.loading import resolve
from ..training import draft_data, train_draft
from ..training.model_card import draft_card
from .common import run_standalone, save_training_record


def add_parser(sub):
    p = sub.add_parser("train-draft", help="train a DFlash draft for an mlx-lm target")
    train_draft.add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    args.target = str(resolve(args.target, "target"))  # a local directory or a hub id
    if not (Path(args.target) / "config.json").is_file():
        raise DFlashError(f"--target '{args.target}' is not an mlx-lm model directory (no config.json)")
    if args.block_size is not None and not 2 <= args.block_size <= 64:
        raise DFlashError(f"--block-size {args.block_size} is out of range: use 2..64")
    if args.add_layers and not args.resume:
        raise DFlashError(f"--add-layers {args.add_layers} grows a trained draft: give --resume DRAFT too")
    if args.data_only:
        if not args.data_cache or (len(args.data_cache) > 1 and not args.draft_vocab):
            raise DFlashError(
                "--data-only needs --data-cache FILE (one file) to write the data to "
                "(several files are only read: to write --draft-vocab from them)"
            )
        if args.draft_vocab and not (Path(args.out) / "config.json").is_file():
            raise DFlashError(
                f"--draft-vocab with --data-only writes into a draft directory; {args.out} has no config.json"
            )
    log = lambda m: print(m, flush=True)
    if args.data_only:
        draft_data.write_data(args, log)
        return 0
    summary = train_draft.train(args, log)
    save_training_record(args.out, "train-draft", summary, draft_card)
    print(f"wrote {args.out}: engine tokens per cycle {summary['eval_tau']}")
    return 0


if __name__ == "__main__":
    run_standalone("dflash_core.commands.train_draft", train_draft.add_arguments, run)
