"""How much of a draft's acceptance does the target itself allow? Along the target's own greedy
replies to the benchmark's requests, the target's top-1 probability at each position, and how often
the draft's first proposal of a cycle was kept, by that probability.

A draft is accepted when it names the target's argmax. Where the target is sure (top-1 probability
near 1) the argmax is a stable function of the context that a small model can learn; where it
hesitates between tokens, the argmax turns on details the target computes in all its layers at
that very position, which a draft that only sees the hidden states of earlier positions cannot
reproduce. The share of hesitant positions in a target's replies bounds what any draft of it
reaches. Greedy decoding, the pair's own block size and the engine's defaults.
  python scripts/target_confidence.py [--model NAME] [--max-tokens 256]
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflash_core  # noqa: E402,F401  (system BLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core import backend  # noqa: E402
from dflash_core.events import CycleEvent  # noqa: E402
from dflash_core.loading import load_pair  # noqa: E402
from dflash_core.registry import DEFAULT_PAIR  # noqa: E402

BINS = [(0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_PAIR)
    ap.add_argument("--prompts", default=str(ROOT / "assets/prompts/chat_bench.json"))
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()

    pair = load_pair(args.model)
    confidence, kept = [], []  # per reply position; per cycle: (confidence there, first kept?)
    for prompt in json.loads(Path(args.prompts).read_text()):
        ids = pair.encode(prompt, chat_template=True)
        events = list(
            pair.dflash(ids, args.max_tokens, pair.block_size, min_confidence=backend.default_min_confidence())
        )
        reply = events[-1].tokens
        logits = pair.model(mx.array(ids + reply)[None])[0, len(ids) - 1 : -1]  # predicts reply[i] at row i
        top1 = mx.max(mx.softmax(logits.astype(mx.float32), axis=-1), axis=-1).tolist()
        confidence += top1
        position = 0  # index in the reply of the cycle's staged token
        for ev in events[:-1]:
            if isinstance(ev, CycleEvent):
                if position + 1 < len(top1):
                    kept.append((top1[position + 1], ev.accepted_len > 0))
                position += len(ev.committed)
    n = len(confidence)
    print(f"{n} reply positions, {len(kept)} cycles; target top-1 probability mean {sum(confidence) / n:.2f}")
    print("top-1 probability | share of positions | first proposal kept")
    for lo, hi in BINS:
        share = sum(lo <= c < hi for c in confidence) / n
        in_bin = [k for c, k in kept if lo <= c < hi]
        rate = f"{sum(in_bin) / len(in_bin):.0%} of {len(in_bin)}" if in_bin else "-"
        print(f"{lo:.1f}-{min(hi, 1):.1f} | {share:.0%} | {rate}")


if __name__ == "__main__":
    main()
