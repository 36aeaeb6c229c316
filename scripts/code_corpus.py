"""Copies Python source that is not the standard library into OUT_DIR: the packages installed
next to this interpreter (site-packages), at most --cap characters of each, chosen at random.
The shipped coder draft's last stages trained on its target's continuations of prompts cut from
it (`train-draft --data OUT_DIR`): code its stdlib-trained target never saw, as users' code is.
    usage: python scripts/code_corpus.py OUT_DIR
Left out: packages that are mostly generated code (API types, chart validators, tables, the
installer's vendored copies), and --hold-out packages, kept for measuring drafts on unseen code."""

import argparse
import ast
import random
import site
from pathlib import Path

GENERATED = [
    "openai",
    "plotly",
    "_plotly_utils",
    "regex",
    "idna",
    "pip",
    "setuptools",
    "playwright",
    "google",
    "pkg_resources",
    "_distutils_hack",
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--cap", type=int, default=3_000_000, help="characters per package at most")
    p.add_argument("--hold-out", nargs="*", default=["rich", "click", "jinja2"])
    args = p.parse_args()
    skip = set(GENERATED) | set(args.hold_out)
    rng = random.Random(0)
    files = chars = 0
    for root in map(Path, site.getsitepackages()):
        for pkg in sorted(d for d in root.iterdir() if d.is_dir() and "." not in d.name and d.name != "__pycache__"):
            if pkg.name in skip:
                continue
            sources = sorted(f for f in pkg.rglob("*.py") if 1_000 < f.stat().st_size < 150_000)
            rng.shuffle(sources)
            size = 0
            for f in sources:
                if size > args.cap:
                    break
                text = f.read_text(errors="replace")
                try:
                    ast.parse(text)  # Python 2 leftovers and templates are not code a user writes
                except (SyntaxError, ValueError):
                    continue
                dest = Path(args.out, pkg.name, f.relative_to(pkg))
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(text)
                size += len(text)
                files += 1
            chars += size
    print(f"{files} files, {chars:,} characters in {args.out}")


if __name__ == "__main__":
    main()
