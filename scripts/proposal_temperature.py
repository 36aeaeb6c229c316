"""At which temperature should a draft sample its proposals? For each multiple of the target's
temperature, the expected tokens per cycle of speculative sampling on the benchmark's requests.

Per cycle that is 1 + sum_k prod_(i<=k) alpha_i, where alpha_i = sum_x min(p_i(x), q_i(x)) is the
chance that proposal i is kept given the ones before it were (Leviathan et al. 2023): the same
mean as counting the tokens that runs keep, with far less spread. A DFlash draft predicts each
block position on its own, so a q flatter than its confidence warrants spends acceptance on
proposals that do not fit together. The best multiple goes into the draft's config.json as
dflash_config.proposal_temperature (the engine's q; any q keeps the output exact).
  python scripts/proposal_temperature.py [--model NAME] [--temperature T] [--multiples 1,0.8,0.6]
"""

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflash_core  # noqa: E402,F401  (system BLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core import engine  # noqa: E402
from dflash_core.loading import load_pair  # noqa: E402
from dflash_core.registry import DEFAULT_PAIR  # noqa: E402
from dflash_core.sampling import Sampling  # noqa: E402


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
    expected = []  # one cycle's expected tokens, appended as the engine accepts
    accept = engine.speculative_accept

    def recording_accept(drafted, q, p):
        kept = mx.minimum(p[: len(drafted)], q).sum(axis=-1)  # alpha_i per proposal
        expected.append(1 + mx.cumprod(kept).sum().item())
        return accept(drafted, q, p)

    engine.speculative_accept = recording_accept
    config = pair.draft.config
    print(
        f"{args.model}, temperature {args.temperature}, top-p {args.top_p}, {len(prompts)} requests x {args.max_tokens} tokens"
    )
    for multiple in [float(x) for x in args.multiples.split(",")]:
        pair.draft.config = replace(config, proposal_temperature=multiple)
        expected.clear()
        kept = []
        for seed, text in enumerate(prompts):
            ids = pair.encode(text, pair.chat_default)
            s = Sampling(args.temperature, args.top_p, seed)
            summary = list(pair.dflash(ids, args.max_tokens, min_confidence=0.0, sampling=s))[-1]
            kept.append(summary.generated / summary.cycles)
        print(
            f"q at {multiple:.2f}x the temperature: expected tokens per cycle {statistics.mean(expected):.3f} "
            f"({len(expected)} cycles); counted {statistics.mean(kept):.3f}",
            flush=True,
        )
    pair.draft.config = config


if __name__ == "__main__":
    main()
