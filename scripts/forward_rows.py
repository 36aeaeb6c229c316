"""Where a DFlash cycle's time goes on this machine, for a real pair: what a target forward costs
by the number of rows it verifies (and how much of it is Python building the graph), and the
engine's own per-cycle split (draft, verify, rollback) against a plain decoding step. On a GPU a
small target's step is bound by graph building and kernel launches, so its rows are not free.

    python scripts/forward_rows.py                                   # default pair, its benchmark requests
    python scripts/forward_rows.py --model M --draft D --save out.json
    python scripts/forward_rows.py --compiled --cycles 0            # also as CUDA's compiled cycles run it
"""

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core.benchmark import DEFAULT_PROMPTS  # noqa: E402
from dflash_core.engine import pipeline  # noqa: E402
from dflash_core.models.loading import load_pair  # noqa: E402

ROWS = (1, 2, 4, 8, 16)


def _filled(pair, cache_tokens: int):
    """The pair's target, its cache holding `cache_tokens` tokens of a chat request."""
    ids = pair.encode("Why is the sky blue during the day but red at sunset? Explain in detail.", True)
    pair.target.prefill((ids * (cache_tokens // len(ids) + 1))[:cache_tokens])
    return pair.target


def _in_one_row_forwards(costs: dict) -> dict:
    return {r: round(c["total_ms"] / costs[1]["total_ms"], 2) for r, c in costs.items()}


def _timed(forward, undo, repeats: int, warmup: int) -> dict:
    """Median ms of forward() from building its graph to its outputs, and of the building alone,
    over `repeats` calls after `warmup` ones; undo() after each puts the cache back."""
    build, total = [], []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        outputs = forward()
        t1 = time.perf_counter()
        mx.eval(outputs)
        t2 = time.perf_counter()
        undo()
        if i >= warmup:
            build.append((t1 - t0) * 1e3)
            total.append((t2 - t0) * 1e3)
    return {"total_ms": round(median(total), 2), "build_ms": round(median(build), 2)}


def forward_costs(pair, cache_tokens: int = 300, repeats: int = 30, rows_list=ROWS) -> dict:
    """rows -> median ms of a verify forward (from building its graph to its logits) and of the
    building alone, over a cache of cache_tokens."""
    target = _filled(pair, cache_tokens)
    return {
        rows: _timed(
            lambda rows=rows: target.verify([1] * rows), lambda rows=rows: target.rollback(kept=0, fed=rows), repeats, 1
        )
        for rows in rows_list
    }


def compiled_forward_costs(pair, cache_tokens: int = 300, repeats: int = 30, rows_list=ROWS) -> dict:
    """As forward_costs, with the forward as CUDA's cycles run it: the target's caches of one fixed
    size (pipeline.capacity_for) with their length on the device, the forward a compiled graph
    (traced once per row count, then replayed). The caches go in as inputs and the rows it writes
    are not kept, so every call sees the same cache."""
    target = _filled(pair, cache_tokens)
    target.on_device(pipeline.capacity_for(cache_tokens + max(rows_list)))
    buffers = [x for c in target.cache for x in (c.keys, c.values)]

    def load(state):
        for c, k, v in zip(target.cache, state[::2], state[1::2]):
            c.keys, c.values = k, v

    def forward(tokens, *state):
        load(state)
        logits, taps = target.verify(tokens)
        return [logits, *taps]

    graph = mx.compile(forward)
    # the first two calls of a row count: its trace, then a warm-up; a trace leaves its
    # placeholders in the caches, hence load(buffers) after each call
    out = {
        rows: _timed(
            lambda rows=rows: graph(mx.ones((rows,), dtype=mx.int32), *buffers), lambda: load(buffers), repeats, 2
        )
        for rows in rows_list
    }
    target.off_device(cache_tokens)
    return out


def cycle_split(pair, prompt: str, max_tokens: int) -> dict:
    """The engine's medians per drafted cycle on one request (the fixed policy, every proposal
    verified: the machinery's own cost), next to plain decoding's time a token. Where a cycle
    syncs with the host once (a GPU), draft_ms is the time to launch the draft and its compute
    falls in verify_ms: their sum, cycle_ms, is the figure to read."""
    ids = pair.encode(prompt, pair.chat_default)
    *_, base = pair.baseline(ids, max_tokens)
    *cycles, summary = pair.dflash(ids, max_tokens, policy="fixed", min_confidence=0.0)
    step_ms = 1e3 / base.decode_tps
    cycle_ms = median(e.cycle_ms for e in cycles)
    return {
        "tokens_per_cycle": round(summary.tokens_per_cycle, 2),
        "cycle_ms": round(cycle_ms, 2),
        **{k: round(median(getattr(e, k) for e in cycles), 2) for k in ("draft_ms", "verify_ms", "rollback_ms")},
        "baseline_ms_per_token": round(step_ms, 2),
        "cycle_steps": round(cycle_ms / step_ms, 2),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="target (default: the shipped pair)")
    p.add_argument("--draft")
    p.add_argument("--prompts", help="JSON list of requests (default: the benchmark's)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--rows", default=",".join(map(str, ROWS)), help="row counts to time (one row always), e.g. 2,4,8,16"
    )
    p.add_argument("--cycles", type=int, help="engine cycles on only the first N requests (0: none)")
    p.add_argument(
        "--compiled",
        action="store_true",
        help="also time the forward as CUDA's cycles run it (compiled, fixed size); targets with plain "
        "attention caches only, as the compiled cycles",
    )
    p.add_argument("--save", help="also write the JSON here")
    args = p.parse_args()
    pair = load_pair(args.model, args.draft, allow_download=False)
    prompts = json.loads(Path(args.prompts or DEFAULT_PROMPTS[pair.chat_default]).read_text())
    res = {"device": str(mx.default_device()), "dtype": str(pair.compute_dtype or "the weights' own")}
    rows_list = sorted({1, *map(int, args.rows.split(","))})
    res["target_forward_by_rows"] = rows = forward_costs(pair, rows_list=rows_list)
    res["forward_in_one_row_forwards"] = _in_one_row_forwards(rows)
    if args.compiled and pair.target.plain_kv():  # the caches the compiled cycles take
        res["compiled_forward_by_rows"] = rows = compiled_forward_costs(pair, rows_list=rows_list)
        res["compiled_in_one_row_forwards"] = _in_one_row_forwards(rows)
    prompts = prompts if args.cycles is None else prompts[: args.cycles]
    res["cycles"] = [{"prompt": q, **cycle_split(pair, q, args.max_tokens)} for q in prompts]
    if prompts:
        res["cycle_steps_median"] = median(c["cycle_steps"] for c in res["cycles"])
    text = json.dumps(res, indent=1)
    print(text)
    if args.save:
        Path(args.save).write_text(text)


if __name__ == "__main__":
    main()
