"""Whether the engine's plain steps (the adaptive policy's v = 0: the target alone, its taps kept
for the draft) cost what plain decoding's steps cost: mlx-lm's `generate_step` against the
engine's plain-step loop on the shipped pair, interleaved, milliseconds a token, medians. Beside
them, to tell where a difference comes from: the same loop without taps, the same loop on
mlx-lm's generation stream, and the whole engine (events, policy) with every cycle a plain step,
synchronous, pipelined, and pipelined as compiled graphs (with MLX's attention in place of the
fused kernels too, where they are on); a pipelined engine's figure also gives the host's median
time to build and launch one step (where it nears the step's, the host is what bounds it).

    python scripts/plain_steps.py [--tokens 64] [--repeat 5] [--prompt TEXT] [--model DIR --draft DIR] [--save FILE]
"""

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402
from mlx_lm.generate import generate_step, generation_stream  # noqa: E402

from dflash_core.engine import fused_attention, pipeline, policy  # noqa: E402
from dflash_core.engine.cycle import COMPILE_ENV, PIPELINE_ENV, _plain_steps  # noqa: E402
from dflash_core.engine.target import Target  # noqa: E402
from dflash_core.loading import load_pair  # noqa: E402


def baseline_ms(target, ids: list, n: int) -> float:
    t0 = None
    for i, _ in enumerate(
        generate_step(mx.array(ids), target.model, max_tokens=n, sampler=lambda lp: mx.argmax(lp, -1))
    ):
        if i == 0:  # from the first token on, as the benchmark times decoding
            t0 = time.perf_counter()
    return (time.perf_counter() - t0) / (n - 1) * 1e3


def plain_steps_ms(target, ids: list, n: int, stream=None) -> float:
    if stream is not None:
        with mx.stream(stream):
            return plain_steps_ms(target, ids, n)
    target.reset()
    staged = mx.argmax(target.prefill(ids)).item()
    steps = iter(range(n - 1))
    t0 = None
    for i, _ in enumerate(_plain_steps(target, staged, lambda: next(steps, None) is not None, None)):
        if i == 0:
            t0 = time.perf_counter()
    return (time.perf_counter() - t0) / (n - 1) * 1e3


def greedy_steps_ms(target, ids: list, n: int) -> float:
    """The plain-step loop without the target's probability of its token (the policy's `sure`):
    argmax alone, as generate_step samples greedily."""
    target.reset()
    token = mx.array([mx.argmax(target.prefill(ids)).item()])
    step = None
    t0 = time.perf_counter()
    for i in range(n):
        logits, taps = target.step(token)
        nxt = mx.argmax(logits, axis=-1, keepdims=True)
        mx.async_eval(nxt, *taps)
        if step is not None:
            step.item()
        if i == 0:
            t0 = time.perf_counter()
        step = token = nxt
    step.item()
    return (time.perf_counter() - t0) / (n - 1) * 1e3


class _Timed(pipeline.Launched):
    """A pipelined cycle that also notes the host's time to launch it."""

    launches = []

    def __init__(self, *args):
        super().__init__(*args)
        self.launches.append(self.launch_ms)


def engine_ms(pair, ids: list, n: int, switches: dict, launches: list = None) -> float:
    """The whole engine, its policy made to step plainly after the first cycle, with the engine
    switches `switches` (environment variable -> "0" or "1"); the host's launch times of its
    pipelined steps go to `launches`."""
    before, keep = policy.Policy.before_draft, policy.Policy.keep_plain
    policy.Policy.before_draft = lambda self: (
        policy._plain_step(self.costs.plain_s(), "forced") if self.drafted_any else None
    )
    policy.Policy.keep_plain = lambda self: True
    saved = {k: os.environ.get(k) for k in switches}
    os.environ.update(switches)
    fused_attention.enabled()  # reads its switch again
    graphs = pair.target.compiled_cycles
    if fused_attention.ENV in switches:  # graphs traced with the other attention are not this run's
        pair.target.compiled_cycles = {}
    pipeline.Launched, _Timed.launches = _Timed, []
    try:
        events = list(pair.dflash(ids, n + 8))
    finally:
        policy.Policy.before_draft, policy.Policy.keep_plain = before, keep
        pipeline.Launched = _Timed.__mro__[1]
        pair.target.compiled_cycles = graphs
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        fused_attention.enabled()
    if launches is not None:
        launches.extend(_Timed.launches[2:])  # plain steps'
    steps = [ev for ev in events[:-1] if ev.decision.plain_step]
    return (steps[-1].t - steps[0].t) / (len(steps) - 1) * 1e3


ENGINES = {  # name -> engine switches
    "engine, every cycle a plain step, synchronous": {PIPELINE_ENV: "0"},
    "engine, every cycle a plain step, pipelined": {PIPELINE_ENV: "1", COMPILE_ENV: "0"},
    "engine, every cycle a plain step, pipelined, compiled": {PIPELINE_ENV: "1", COMPILE_ENV: "1"},
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--prompt", default="Explain what a black hole is in simple terms.")
    ap.add_argument(
        "--model",
        help="target (default: the shipped pair's); a model without a chat template takes the prompt as it is",
    )
    ap.add_argument("--draft")
    ap.add_argument("--save", help="also write the figures here (JSON)")
    args = ap.parse_args()
    pair = load_pair(args.model, args.draft)
    pair._use_fastest_threads(
        "baseline"
    )  # both loops on plain decoding's fastest BLAS threads, as the engine's plain steps run
    ids = pair.encode(args.prompt, chat_template=True)  # as it is where the model has no template
    untapped = Target(pair.target.model, [])
    variants = {
        "generate_step": lambda: baseline_ms(pair.target, ids, args.tokens),
        "plain steps": lambda: plain_steps_ms(pair.target, ids, args.tokens),
        "plain steps, no taps": lambda: plain_steps_ms(untapped, ids, args.tokens),
        "plain steps, argmax only": lambda: greedy_steps_ms(pair.target, ids, args.tokens),
        "plain steps, generation stream": lambda: plain_steps_ms(pair.target, ids, args.tokens, generation_stream),
    }
    engines = dict(ENGINES)
    if fused_attention.enabled():
        engines["engine, every cycle a plain step, pipelined, compiled, MLX's attention"] = {
            PIPELINE_ENV: "1",
            COMPILE_ENV: "1",
            fused_attention.ENV: "0",
        }
    launches = {name: [] for name in engines}
    for name, switches in engines.items():
        variants[name] = partial(engine_ms, pair, ids, args.tokens, switches, launches[name])
    times = {name: [] for name in variants}
    for fn in variants.values():  # warm-up
        fn()
    for host in launches.values():
        host.clear()
    for _ in range(args.repeat):
        for name, fn in variants.items():
            times[name].append(fn())
    for name, ms in times.items():
        host = f"; the host's launch {median(launches[name]):.2f} ms" if launches.get(name) else ""
        print(f"{name}: {median(ms):.2f} ms a token (runs {', '.join(f'{m:.2f}' for m in ms)}){host}")
    if args.save:
        figures = {name: {"median_ms": median(ms), "runs_ms": ms} for name, ms in times.items()}
        for name, host in launches.items():
            if host:
                figures[name]["launch_median_ms"] = median(host)
        Path(args.save).write_text(json.dumps({"device": str(mx.default_device()), "tokens": args.tokens, **figures}))


if __name__ == "__main__":
    main()
