"""How much a target repeats itself: its greedy continuation of each prompt (chat template, as
`generate` sends it), and the share of the non-blank lines it writes that repeat an earlier line
of the same reply. Loops are easy to draft, so they lift tokens per cycle while the code gets
worse: read this next to acceptance figures when comparing targets.

    python scripts/repeated_lines.py                              # shipped target, the three new-code sets
    python scripts/repeated_lines.py --target T --prompts a.json b.json --max-tokens 256
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)
from dflash_core.loading import DEFAULT_PAIR, SHIPPED  # noqa: E402
from dflash_core.train_draft import encode_prompt, greedy, load_frozen_target  # noqa: E402

NEW_CODE = [ROOT / "assets" / "prompts" / f for f in ("new_python.json", "new_python_confirm.json", "unseen_packages.json")]


def repeated(text: str) -> tuple:
    """(lines that repeat an earlier line, non-blank lines), whitespace at the ends ignored."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return len(lines) - len(set(lines)), len(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=str(SHIPPED[DEFAULT_PAIR][0]))
    p.add_argument("--prompts", nargs="+", default=[str(f) for f in NEW_CODE])
    p.add_argument("--max-tokens", type=int, default=256)
    args = p.parse_args()
    model, tok = load_frozen_target(args.target)
    for f in args.prompts:
        reps = lines = mostly = 0
        prompts = json.loads(Path(f).read_text())
        for prompt in prompts:
            reply = tok.decode(greedy(model, encode_prompt(tok, prompt, True), args.max_tokens, set(tok.eos_token_ids)))
            r, n = repeated(reply)
            reps, lines, mostly = reps + r, lines + n, mostly + (r >= n / 2)
        print(f"{Path(f).name}: {reps}/{lines} lines repeat an earlier line ({100 * reps / max(lines, 1):.0f}%); "
              f"{mostly} of {len(prompts)} replies mostly repeats")


if __name__ == "__main__":
    main()
