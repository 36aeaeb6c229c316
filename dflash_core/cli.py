"""`python -m dflash_core <command>`. Each command module exposes `add_parser(subparsers)`, which
registers its arguments and sets `func=run`; bad input is one `error: ...` line and exit 2."""

import argparse
import importlib
import os
import sys

from .errors import DFlashError
from .models import distributed

# command modules, in the order `--help` lists them
COMMANDS = ["generate", "serve", "benchmark", "models", "doctor", "train-target", "train-draft"]


# `dflash ...` when installed with pip, `python -m dflash_core ...` from a clone
PROG = "dflash" if os.path.basename(sys.argv[0]) == "dflash" else "python -m dflash_core"


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise DFlashError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f".commands.{name.replace('-', '_')}", __package__).add_parser(sub)
    return parser


# how MLX says an allocation failed: the CPU allocator, CUDA, Metal
OUT_OF_MEMORY = ("Unable to allocate", "out of memory", "Insufficient Memory", "OutOfMemory")
# the options that set how much a command holds at once, where it has them
MEMORY_KNOBS = ("batch_size", "anchors", "gen_batch", "max_tokens", "max_prompt_tokens", "response_tokens", "seq_len")


def main(argv=None, parser=None) -> int:
    """Parse argv with `parser` (default: every command's) and run the chosen command."""
    args = None
    try:
        distributed.quiet_unless_primary()  # under mlx.launch every rank runs this: rank 0 speaks
        args = (parser or build_parser()).parse_args(argv)
        return args.func(args) or 0
    except DFlashError as e:
        print(f"error: {e}", file=sys.stderr)
        distributed.give_rank_0_time()
        return 2
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and not any(s in str(e) for s in OUT_OF_MEMORY):
            raise  # a bug: its traceback is what fixes it
        knobs = [f"--{k.replace('_', '-')}" for k in MEMORY_KNOBS if hasattr(args, k)]
        smaller = f"lower {', '.join(knobs)}, or use" if knobs else "use"
        print(
            f"error: out of memory ({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
            f"{smaller} a smaller model",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
