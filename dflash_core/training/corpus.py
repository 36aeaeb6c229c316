"""Source text to train on: Python files split into training and held-out sets by a stable hash,
prompts cut from their top-level lines, and copies with the code's own names swapped for others."""

import builtins
import keyword
import random
import re
import sysconfig
import zlib
from pathlib import Path

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
HELDOUT_EVERY = 20  # one file in 20 (by a hash of its path) is never trained on


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list:
    """The *.py files under root, without test suites and installed packages."""
    files = []
    for f in sorted(Path(root).rglob("*.py")):
        rel = f.relative_to(root)
        if SKIP_DIRS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        files.append(f)
    return files


def is_heldout(rel: str) -> bool:
    return zlib.crc32(rel.encode()) % HELDOUT_EVERY == 0


def read_corpus(root: Path) -> tuple:
    """(train, heldout): lists of (relative path, text), split by a stable hash of the path."""
    train, heldout = [], []
    for f in source_files(root):
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 200:
            continue
        rel = str(f.relative_to(root))
        (heldout if is_heldout(rel) else train).append((rel, text))
    return train, heldout


def top_level_prompts(text: str, rng: random.Random, n: int, max_lines: int = 8) -> list:
    """Prompts a user might type: 1..max_lines lines starting at a top-level def/class/statement."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line[:1].isalpha() or line[:1] == "@"]
    out = []
    for s in rng.sample(starts, min(n, len(starts))):
        k = rng.randint(1, max_lines)
        prompt = "\n".join(lines[s : s + k]).rstrip()
        if len(prompt) >= 8 and s + k < len(lines):
            out.append(prompt)
    return out


# ---------------------------------------------------------------------------- renaming

_NAME = r"[A-Za-z_]\w*"
_NAMES = rf"{_NAME}(?:\s*,\s*{_NAME})*"
_BINDINGS = [  # where Python code names things: def/class, parameters, assignments, for, as
    re.compile(rf"\b(?:def|class)\s+({_NAME})"),
    re.compile(rf"^\s*({_NAMES})\s*=[^=]", re.M),
    re.compile(rf"\bfor\s+({_NAMES})\s+in\b"),
    re.compile(rf"\bas\s+({_NAME})"),
]
_PARAMS = re.compile(r"\bdef\s+\w+\s*\(([^)]*)\)")
_KEEP = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | {"self", "cls"}


def bound_names(text: str) -> set:
    """The names a piece of code chooses itself (not keywords, builtins, dunders, attributes, or
    one-letter names, which double as words and string prefixes)."""
    found = {n for pat in _BINDINGS for m in pat.finditer(text) for n in re.findall(_NAME, m[1])}
    found |= {
        p.strip(" *").split(":")[0].split("=")[0].strip() for m in _PARAMS.finditer(text) for p in m[1].split(",")
    }
    return {n for n in found if len(n) > 1 and re.fullmatch(_NAME, n) and n not in _KEEP and not n.startswith("__")}


def with_renamed_names(texts: list, fraction: float, rng: random.Random) -> list:
    """A share of the texts with their own names swapped (consistently within a text, also in
    its docstrings) for names other texts chose. Users write new code, not the corpus: renamed
    code is code no model saw, which teaches copying names from the context over recalling them.
    Attribute names after a dot stay, so `x.append` and `os.path.join` keep meaning what they mean."""
    if fraction <= 0:
        return texts
    style = lambda n: (n.isupper(), n[:1].isupper())  # CONSTANT, ClassName or snake_case
    names_of = [bound_names(t) for t in texts]
    pools = {}
    for n in sorted(set().union(*names_of)):
        pools.setdefault(style(n), []).append(n)
    out = []
    for text, own in zip(texts, names_of):
        names = sorted(own) if rng.random() < fraction else ()
        taken, swap = set(re.findall(_NAME, text)), {}
        for n in names:  # a name the text does not use yet, in the style of the old one
            new = next((c for c in (rng.choice(pools[style(n)]) for _ in range(8)) if c not in taken), n)
            swap[n] = new
            taken.add(new)
        if swap:
            # not after a dot (attribute), a backslash (escape) or ! (f-string conversion), nor
            # before a quote (string prefix)
            text = re.sub(rf"(?<![\w.\\!]){_NAME}(?![\w'\"])", lambda m: swap.get(m[0], m[0]), text)  # noqa: B023 (used here)
        out.append(text)
    return out


def renamed_copies(docs: list, copies: int, rng: random.Random) -> list:
    """`copies` copies of each (path, text), every one with the text's own names swapped: more
    data from a small corpus."""
    texts = [t for _, t in docs] * copies
    return [(f"{rel} (renamed)", t) for (rel, _), t in zip(docs * copies, with_renamed_names(texts, 1.0, rng))]
