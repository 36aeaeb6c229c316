"""Arguments and helpers shared by the commands that load a model pair."""
import sys

from ..argtypes import probability
from ..loading import load_pair


def add_pair_args(p):
    p.add_argument("--model", help="target: local mlx-lm dir, hub id, or a shipped pair's name (default: the shipped pair)")
    p.add_argument("--draft", help="DFlash draft: local dir or hub id (default: the registry's draft for --model)")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def load(args):
    log(f"loading {args.model or 'the shipped default pair'} ...")
    return load_pair(args.model, args.draft)


def add_min_confidence_arg(p):
    p.add_argument("--min-confidence", type=probability,
                   help="verify only the leading draft tokens the draft gives at least this probability "
                        "(the first always); 0 verifies all B-1 (default: 0.2 on a CPU, 0 on a GPU)")


def _device_name() -> str:
    """Where a training ran, for its record and model card."""
    import os

    from .. import backend

    if backend.on_cpu():
        return f"a {os.cpu_count()}-core CPU (MLX)"
    return "a GPU (MLX Metal)" if backend.mx.metal.is_available() else "a GPU (MLX CUDA)"


def save_training_record(out, command: str, summary: dict, card) -> None:
    """training.json + the model card README.md, with the exact command that made them."""
    import json
    from pathlib import Path

    argv = sys.argv[1:]  # this command's own arguments, through the CLI or run as a module
    argv = argv[argv.index(command) + 1 :] if command in argv else argv
    summary["command"] = f"python -m dflash_core {command} " + " ".join(argv)
    summary["device"] = _device_name()
    out = Path(out)
    (out / "training.json").write_text(json.dumps(summary, indent=1))
    (out / "README.md").write_text(card(summary))


def run_standalone(module: str, add_arguments, run) -> None:
    """`python -m dflash_core.commands.X`: one command without the CLI's others (e.g. on a bare
    GPU machine that lacks the server's packages)."""
    from ..cli import Parser, main

    parser = Parser(prog=f"python -m {module}")
    add_arguments(parser)
    parser.set_defaults(func=run)
    sys.exit(main(parser=parser))
