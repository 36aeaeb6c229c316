"""Where DFlash and plain greedy decoding first part, and how close the target's choice was there.

A lossless engine emits plain decoding's tokens; on a new backend a failing lossless test is either
an engine bug or two floating-point paths (one-row steps, multi-row verifies) ranking a near-tie
differently. This decodes a pair both ways (the GPU's cycle: every proposal verified), and at the
first token where they part prints the target's two best logits there (one forward over the whole
sequence, no cache): a gap at rounding level is a tie, a wide gap is a bug.

    python scripts/first_divergence.py --family gemma4_text          # the tests' random pair
    python scripts/first_divergence.py --model DIR --draft DIR --prompt "def fib(n):"
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core.engine.events import RunSummary  # noqa: E402
from dflash_core.models.loading import load_pair  # noqa: E402
from dflash_core.training.random_models import FAMILIES, write_pair  # noqa: E402

TEST_PROMPTS = ["def fib(n):", "import os\nfor name in os.listdir('.'):\n"]


def tokens(gen) -> list:
    return next(ev for ev in gen if isinstance(ev, RunSummary)).tokens


def divergence(pair, prompt: str, max_tokens: int, block_size: int) -> dict:
    ids = pair.encode(prompt, chat_template=False)
    base = tokens(pair.baseline(ids, max_tokens))
    ours = tokens(pair.dflash(ids, max_tokens, block_size, min_confidence=0.0, policy="fixed"))
    at = next((i for i, (a, b) in enumerate(zip(base, ours)) if a != b), None)
    report = {"prompt": prompt, "identical": base == ours, "first_difference": at}
    if at is None:
        return report
    logits = pair.target.model(mx.array([ids + base[:at]]))[0, -1].astype(mx.float32)
    top = mx.argsort(-logits)[:2].tolist()
    report.update(
        baseline_token=base[at],
        dflash_token=ours[at],
        top2={int(t): float(logits[t]) for t in top},
        logit_of_each={"baseline": float(logits[base[at]]), "dflash": float(logits[ours[at]])},
        gap=float(logits[top[0]] - logits[top[1]]),
    )
    return report


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", choices=FAMILIES, help="build the tests' random pair of this family")
    p.add_argument("--model")
    p.add_argument("--draft")
    p.add_argument("--prompt", action="append", help="default: the lossless tests' first two")
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--block-size", type=int, default=6)
    args = p.parse_args()
    if args.family:
        seed = 11 + FAMILIES.index(args.family)  # as tests/conftest.py seeds it
        target, draft = write_pair(Path(tempfile.mkdtemp()), args.family, seed=seed)
        args.model, args.draft = str(target), str(draft)
    pair = load_pair(args.model, args.draft, allow_download=False)
    for prompt in args.prompt or TEST_PROMPTS:
        print(json.dumps(divergence(pair, prompt, args.max_tokens, args.block_size)))


if __name__ == "__main__":
    main()
