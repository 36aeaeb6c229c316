"""At which temperature should a draft sample its proposals? For several multiples of the target's
temperature, the expected tokens per cycle of speculative sampling on the benchmark's requests.

Per cycle that is 1 + sum_k prod_(i<=k) alpha_i, where alpha_i = sum_x min(p_i(x), q_i(x)) is the
chance that proposal i is kept given the ones before it were (Leviathan et al. 2023). The texts
that sampling writes differ from run to run far more than the settings do, so every multiple is
scored on the same cycles: the engine runs once at the target's temperature, and each cycle's q
is re-tempered to each multiple (q_m proportional to q ** (1 / m), exact without top-p). alpha_1
is then exact for every multiple; later positions keep the target's p of the proposals actually
drawn, an approximation. A DFlash draft predicts each block position on its own, so a q flatter
than its confidence warrants could spend acceptance on proposals that do not fit together; any q
keeps the output exact. The engine samples q at the target's own temperature.
  python scripts/proposal_temperature.py [--model NAME] [--temperature T] [--multiples 1,0.8,0.6]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflash_core  # noqa: E402,F401  (system BLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core.engine import cycle as engine  # noqa: E402
from dflash_core.engine.sampling import Sampling  # noqa: E402
from dflash_core.models.loading import load_pair  # noqa: E402
from dflash_core.models.registry import DEFAULT_PAIR  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_PAIR)
    ap.add_argument("--prompts", default=str(ROOT / "assets/prompts/chat_bench.json"))
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--multiples", default="1.0,0.8,0.6,0.4")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()

    pair = load_pair(args.model)
    prompts = json.loads(Path(args.prompts).read_text())
    multiples = [float(x) for x in args.multiples.split(",")]
    first, expected = {m: [] for m in multiples}, {m: [] for m in multiples}
    accept = engine.speculative_accept

    def scoring_accept(drafted, q, p):
        for m in multiples:
            q_m = mx.softmax(mx.log(q) / m, axis=-1)
            kept = mx.minimum(p[: len(drafted)], q_m).sum(axis=-1)  # alpha_i per proposal
            first[m].append(kept[0].item())
            expected[m].append(1 + mx.cumprod(kept).sum().item())
        return accept(drafted, q, p)

    engine.speculative_accept = scoring_accept
    for seed, text in enumerate(prompts):
        ids = pair.encode(text, pair.chat_default)
        list(
            pair.dflash(ids, args.max_tokens, min_confidence=0.0, sampling=Sampling(args.temperature, args.top_p, seed))
        )
    n = len(expected[multiples[0]])
    print(
        f"{args.model}, temperature {args.temperature}, top-p {args.top_p}, {len(prompts)} requests x {args.max_tokens} tokens, {n} cycles"
    )
    for m in multiples:
        print(
            f"q at {m:.2f}x the temperature: first proposal kept {statistics.mean(first[m]):.3f}, "
            f"expected tokens per cycle {statistics.mean(expected[m]):.3f}"
        )


if __name__ == "__main__":
    main()
