"""`python -m dflash_core <command>`. Each command module exposes `add_parser(subparsers)`, which
registers its arguments and sets `func=run`; bad input is one `error: ...` line and exit 2."""
import argparse
import importlib
import os
import sys

from .errors import DFlashError

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


def main(argv=None, parser=None) -> int:
    """Parse argv with `parser` (default: every command's) and run the chosen command."""
    try:
        args = (parser or build_parser()).parse_args(argv)
        return args.func(args) or 0
    except DFlashError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
