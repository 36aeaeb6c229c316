"""What the adaptive policy predicted against what each cycle measured, cycle by cycle, on a few
held-out requests of the shipped pair: beside plain decoding, both policies (the fixed one at this
device's default threshold), `--repeat` times.
Where a policy misjudges a request (drafting on where it loses, or stepping plainly where drafting
pays), the trace says whether the acceptance or the cost was off: each cycle's predicted tokens and
cost in plain steps, its accepted length and its measured milliseconds, and the plain step's
measured cost beside plain decoding's.

    DFLASH_DTYPE=float32 python scripts/policy_trace.py --requests 3,36 --save policy-trace.json

A cycle's predicted cost and its `measured_steps` are both in the cost model's plain step
(`step_ms`); `*_in_steps` are in plain decoding's, measured beside it, so the two tell apart a
misjudged cycle from a misjudged plain step. Prints one line per request and run; --save writes
every cycle too."""

import argparse
import json
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)
from dflash_core import backend  # noqa: E402
from dflash_core.models.loading import load_pair  # noqa: E402
from dflash_core.models.registry import DEFAULT_PAIR  # noqa: E402
from dflash_core.training.chat_prompts import heldout_requests  # noqa: E402


def summary(cycles: list, step_ms: float) -> dict:
    """Measured against predicted, by kind: plain steps, drafted cycles (`*_in_steps`: in plain
    decoding's steps of `step_ms`; `*_measured_steps`, `*_predicted_steps`: in the cost model's)."""
    plain = [c for c in cycles if c["plain_step"]]
    drafted = [c for c in cycles if not c["plain_step"]]
    out = {"plain_steps": len(plain), "drafted_cycles": len(drafted)}
    if plain:
        out["plain_step_in_steps"] = round(sum(c["cycle_ms"] for c in plain) / len(plain) / step_ms, 2)
    if drafted:
        out |= {
            "drafted_tokens": round(sum(c["accepted_len"] + 1 for c in drafted) / len(drafted), 2),
            "drafted_expected_tokens": round(median(c["expected_tokens"] for c in drafted), 2),
            "drafted_cycle_in_steps": round(sum(c["cycle_ms"] for c in drafted) / len(drafted) / step_ms, 2),
            "drafted_measured_steps": round(median(c["measured_steps"] for c in drafted), 2),
            "drafted_predicted_steps": round(median(c["predicted_steps"] for c in drafted), 2),
            "model_step_in_steps": round(median(c["step_ms"] for c in drafted) / step_ms, 2),
        }
    return out


def trace(ev) -> dict:
    """A cycle's decision beside its outcome (a CycleEvent's own fields)."""
    d = ev.decision
    return {
        "plain_step": ev.plain_step,
        "verified": ev.verified,
        "accepted_len": ev.accepted_len,
        "cycle_ms": round(ev.cycle_ms, 2),
        "measured_steps": round(ev.measured_steps, 2),
        "step_ms": round(d.step_ms, 2),
        "expected_tokens": round(d.expected_tokens, 2),
        "predicted_steps": round(d.predicted_steps, 2),
        "reason": d.reason,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="3", help="held-out request numbers, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--save")
    args = ap.parse_args()
    pair = load_pair(DEFAULT_PAIR)
    prompts = heldout_requests()
    runs = []
    for i in (int(x) for x in args.requests.split(",")):
        ids = pair.encode(prompts[i])
        for rep in range(args.repeat):
            *_, base = pair.baseline(ids, args.max_tokens)
            step_ms = 1e3 / base.decode_tps
            run = {"request": i, "repeat": rep, "baseline_ms_per_token": round(step_ms, 2)}
            for policy, threshold in (("adaptive", None), ("fixed", backend.default_min_confidence())):
                *events, s = pair.dflash(ids, args.max_tokens, pair.block_size, policy=policy, min_confidence=threshold)
                cycles = [trace(ev) for ev in events]
                speedup = round(s.decode_tps / base.decode_tps, 3)
                run[policy] = {"speedup": speedup, "identical": s.tokens == base.tokens, **summary(cycles, step_ms)}
                run[policy]["cycles"] = cycles
            runs.append(run)
            brief = {p: {k: v for k, v in run[p].items() if k != "cycles"} for p in ("adaptive", "fixed")}
            print(json.dumps(run | brief), flush=True)
            if args.save:  # after every run: a run cut off by a time limit keeps what it had
                Path(args.save).write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
