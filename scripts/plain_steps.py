"""Whether the engine's plain steps (the adaptive policy's v = 0: the target alone, its taps kept
for the draft) cost what plain decoding's steps cost: mlx-lm's `generate_step` against the
engine's plain-step loop on the shipped pair, interleaved, milliseconds a token, medians.

    python scripts/plain_steps.py [--tokens 64] [--repeat 5] [--prompt TEXT]
"""

import argparse
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402

from dflash_core.engine.cycle import _plain_steps  # noqa: E402
from dflash_core.loading import load_pair  # noqa: E402


def baseline_ms(target, ids: list, n: int) -> float:
    t0 = None
    for i, _ in enumerate(
        generate_step(mx.array(ids), target.model, max_tokens=n, sampler=lambda lp: mx.argmax(lp, -1))
    ):
        if i == 0:  # from the first token on, as the benchmark times decoding
            t0 = time.perf_counter()
    return (time.perf_counter() - t0) / (n - 1) * 1e3


def plain_steps_ms(target, ids: list, n: int) -> float:
    target.reset()
    staged = mx.argmax(target.prefill(ids)).item()
    steps = iter(range(n - 1))
    t0 = None
    for i, _ in enumerate(_plain_steps(target, staged, lambda: next(steps, None) is not None, None)):
        if i == 0:
            t0 = time.perf_counter()
    return (time.perf_counter() - t0) / (n - 1) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--prompt", default="Explain what a black hole is in simple terms.")
    args = ap.parse_args()
    pair = load_pair(None, None)
    pair._use_fastest_threads(
        "baseline"
    )  # both loops on plain decoding's fastest BLAS threads, as the engine's plain steps run
    ids = pair.encode(args.prompt, chat_template=True)
    times = {"generate_step": [], "plain steps": []}
    baseline_ms(pair.target, ids, 8)  # warm-up
    for _ in range(args.repeat):
        times["generate_step"].append(baseline_ms(pair.target, ids, args.tokens))
        times["plain steps"].append(plain_steps_ms(pair.target, ids, args.tokens))
    for name, ms in times.items():
        print(f"{name}: {median(ms):.1f} ms a token (runs {', '.join(f'{m:.1f}' for m in ms)})")


if __name__ == "__main__":
    main()
