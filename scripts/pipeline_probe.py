"""Pipelined against synchronous cycles (dflash_core.engine.pipeline), per request, both policies,
in one process: a few requests of the held-out chat set, each run as plain decoding and as DFlash
with each policy in each mode (--modes). Prints one JSON line per request; --save writes them all. For the pipelined runs it
also times the host's `mx.async_eval` of each cycle, against the cycle's whole time: where the
launch takes the whole cycle, the host waited for the device there (MLX's CPU backend does:
its async_eval returns once the work is nearly done), and nothing overlapped.

    DFLASH_DTYPE=float32 python scripts/pipeline_probe.py --every 8 --save pipeline-probe.json
    DFLASH_DTYPE=float32 python scripts/pipeline_probe.py --modes compiled,pipelined,synchronous

For medians over repeats, side by side: `python -m dflash_core benchmark --pipeline-sweep`."""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dflash_core.engine.pipeline as pipeline  # noqa: E402  (dflash_core first: the system BLAS before MLX)
from dflash_core.engine.pipeline import mx  # noqa: E402
from dflash_core.models.loading import load_pair  # noqa: E402
from dflash_core.models.registry import DEFAULT_PAIR  # noqa: E402
from dflash_core.training.chat_prompts import HELDOUT  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=int, default=8, help="take every n-th held-out request")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument(
        "--modes",
        default="pipelined,synchronous",
        help="of synchronous, pipelined, compiled (pipelined cycles as compiled graphs), comma-separated",
    )
    ap.add_argument("--save")
    args = ap.parse_args()
    pair = load_pair(DEFAULT_PAIR)
    launches = []  # seconds of each pipelined cycle's async_eval

    class TimedMLX:
        """mlx.core as pipeline.py sees it, with its async_eval timed (only its: a pipelined run's
        cycles, drafted and plain; synchronous runs call mlx.core's own)."""

        def __getattr__(self, name):
            return getattr(mx, name)

        def async_eval(self, *arrays):
            t = time.perf_counter()
            mx.async_eval(*arrays)
            launches.append(time.perf_counter() - t)

    pipeline.mx = TimedMLX()
    rows = []
    for i, prompt in enumerate(json.loads(HELDOUT.read_text())[:: args.every]):
        ids = pair.encode(prompt)
        *_, base = pair.baseline(ids, args.max_tokens)
        row = {"request": i * args.every, "baseline_tps": round(base.decode_tps, 1)}
        for policy in ("fixed", "adaptive"):
            for mode in args.modes.split(","):
                threshold = 0.0 if policy == "fixed" else None
                launches.clear()
                *cycles, s = pair.dflash(
                    ids,
                    args.max_tokens,
                    8,
                    policy=policy,
                    min_confidence=threshold,
                    pipelined=mode != "synchronous",
                    compiled=mode == "compiled",
                )
                drafted, plain = [ev for ev in cycles if ev.drafted], [ev for ev in cycles if ev.plain_step]
                row[f"{policy} {mode}"] = {
                    "speedup": round(s.decode_tps / base.decode_tps, 3),
                    "tokens_per_cycle": round(s.tokens_per_cycle, 2),
                    "identical": s.tokens == base.tokens,
                    "drafted_cycle_ms": round(statistics.median([ev.cycle_ms for ev in drafted] or [0]), 2),
                    "plain_steps": len(plain),
                    **({"plain_step_ms": round(statistics.median(ev.cycle_ms for ev in plain), 2)} if plain else {}),
                    # the host's time to build and launch a pipelined cycle (its draft_ms)
                    **(
                        {"launch_ms": round(statistics.median([ev.draft_ms for ev in drafted]), 2)}
                        if s.pipelined
                        else {}
                    ),
                    **({"async_eval_ms": round(statistics.median(launches) * 1e3, 2)} if launches else {}),
                }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
