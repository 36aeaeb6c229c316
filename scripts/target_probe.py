"""Reads a target before any draft exists: its greedy reply to each prompt (chat template, as
`generate` sends it), how sure it is of that reply, and how much of it repeats itself.
- top-1: the target's own probability of each token it chose, averaged over the replies (and the
  share at >= 0.9). A draft must match that argmax; it rarely does where the target hesitates.
- repeated lines: the share of the non-blank lines a reply writes that repeat an earlier line of
  the same reply, and how many replies are mostly such repeats. Loops are easy to draft, so they
  lift tokens per cycle while the code gets worse: read this next to acceptance figures.

    python scripts/target_probe.py                                   # shipped target, the three new-code sets
    python scripts/target_probe.py --target T1 T2 --prompts a.json b.json --max-tokens 256
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core.models.registry import DEFAULT_PAIR, SHIPPED  # noqa: E402
from dflash_core.models.tokenizer import encode_prompt  # noqa: E402
from dflash_core.training.decoding import greedy, load_frozen_target  # noqa: E402

NEW_CODE = [
    ROOT / "assets" / "prompts" / f for f in ("new_python.json", "new_python_confirm.json", "unseen_packages.json")
]


def repeated(text: str) -> tuple:
    """(lines that repeat an earlier line, non-blank lines), whitespace at the ends ignored."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return len(lines) - len(set(lines)), len(lines)


def chosen_probs(model, prompt: list, reply: list) -> list:
    """The target's probability of each reply token, given everything before it (one forward)."""
    logits = model(mx.array([prompt + reply[:-1]]))[0, len(prompt) - 1 :]
    probs = mx.softmax(logits, axis=-1)
    return mx.take_along_axis(probs, mx.array(reply)[:, None], axis=-1)[:, 0].tolist()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", nargs="+", default=[str(SHIPPED[DEFAULT_PAIR][0])])
    p.add_argument("--prompts", nargs="+", default=[str(f) for f in NEW_CODE])
    p.add_argument("--max-tokens", type=int, default=256)
    args = p.parse_args()
    for target in args.target:
        model, tok = load_frozen_target(target)
        eos = set(tok.eos_token_ids)
        for f in args.prompts:
            probs, reps, lines, mostly = [], 0, 0, 0
            prompts = json.loads(Path(f).read_text())
            for prompt in prompts:
                ids = encode_prompt(tok, prompt, True)
                reply = greedy(model, ids, args.max_tokens, eos)
                probs += chosen_probs(model, ids, reply)
                r, n = repeated(tok.decode([t for t in reply if t not in eos]))
                reps, lines, mostly = reps + r, lines + n, mostly + (r >= n / 2)
            print(
                f"{target} {Path(f).name}: top-1 {sum(probs) / len(probs):.2f} ({sum(q >= 0.9 for q in probs) / len(probs):.0%} "
                f">= 0.9); {reps}/{lines} lines repeat an earlier line ({reps / max(lines, 1):.0%}); "
                f"{mostly} of {len(prompts)} replies mostly repeats",
                flush=True,
            )


if __name__ == "__main__":
    main()
