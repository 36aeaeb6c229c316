"""What each part of a DFlash cycle costs the host, for a real pair: per part (a plain step, the
draft's forward split into its layers and its head, the verify, the draft context's extension),
the operations in its graph, the time to build the graph, and the time to build and evaluate it,
medians over a 300-token cache; then the Python functions a whole run spends most time in.

On a GPU a small target is bound by the host: every operation costs a launch whatever its size,
so the operation count says what a part costs, and the build time how much of it is Python.

    python scripts/cycle_profile.py --save out.json
"""

import argparse
import cProfile
import io
import json
import pstats
import re
import sys
import time
from collections import Counter
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core.engine.draft import DraftContext  # noqa: E402
from dflash_core.models.loading import load_pair  # noqa: E402

PROMPT = "Why is the sky blue during the day but red at sunset? Explain in detail."


def operations(outputs: list) -> Counter:
    """The primitives in the (not yet evaluated) graph of `outputs`, by name."""
    f = io.StringIO()
    mx.export_to_dot(f, *outputs)
    return Counter(re.findall(r'label ?= ?"([A-Za-z_]+)', f.getvalue()))


def costs(build, repeats: int) -> dict:
    """Median ms to build the graph of `build()` and to build and evaluate it; its operations."""
    ops = operations(build())
    built, total = [], []
    for i in range(repeats + 1):  # the first warms up
        mx.synchronize()
        t0 = time.perf_counter()
        out = build()
        t1 = time.perf_counter()
        mx.eval(out)
        t2 = time.perf_counter()
        if i:
            built.append((t1 - t0) * 1e3)
            total.append((t2 - t0) * 1e3)
    return {
        "ms": round(median(total), 3),
        "build_ms": round(median(built), 3),
        "operations": sum(ops.values()),
        "top": dict(ops.most_common(12)),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model")
    p.add_argument("--draft")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--block-size", type=int, help="the draft's block (default: the pair's)")
    p.add_argument("--draft-quant", type=int, choices=(4, 8), help="quantize the draft's layers")
    p.add_argument("--save")
    args = p.parse_args()
    pair = load_pair(args.model, args.draft, allow_download=False, draft_quant=args.draft_quant)
    target, draft = pair.target, pair.draft
    B, mask_id = args.block_size or pair.block_size, draft.config.mask_token_id
    head = target.draft_head(pair.draft_vocab)  # as the engine proposes (the vocabulary where it pays)
    ids = pair.encode(PROMPT, pair.chat_default)
    ids = (ids * (300 // len(ids) + 1))[:300]
    ctx = DraftContext(draft)
    target.prefill(ids, on_taps=ctx.extend)
    mx.eval([c.state for c in target.cache], *[x for kv in ctx.kv for x in kv])
    block_ids = mx.array([1] + [mask_id] * (B - 1))

    def step():  # one row; the cache grows by one: trimmed back below
        logits, taps = target.step(mx.array([1]))
        return [mx.argmax(logits, axis=-1), *taps]

    def verify():
        logits, taps = target.verify(mx.array([1] * B))
        return [mx.argmax(logits, axis=-1), *taps]

    def layers():
        return [draft.propose(target.embed(block_ids)[None], ctx.kv, ctx.length)]

    hidden = layers()[0]
    mx.eval(hidden)

    def draft_head():
        logits = head.logits(hidden[:, 1:])[0]
        rows = mx.argmax(logits, axis=-1)
        sure = mx.exp(mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1))
        return [head.token_ids(rows), sure]

    def draft_forward():
        logits = head.logits(draft.propose(target.embed(block_ids)[None], ctx.kv, ctx.length)[:, 1:])[0]
        rows = mx.argmax(logits, axis=-1)
        sure = mx.exp(mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1))
        return [head.token_ids(rows), sure]

    _, taps = target.verify(mx.array([1] * B))
    mx.eval(taps)
    target.rollback(kept=0, fed=B)

    def extend():  # the draft context grows by B rows: restored below
        saved = (list(ctx.kv), ctx.length, [c.offset for c in ctx.caches])
        ctx.extend(taps)
        out = [x for kv in ctx.kv for x in kv]
        ctx.kv, ctx.length = saved[0], saved[1]
        for c, off in zip(ctx.caches, saved[2]):
            c.offset = off
        return out

    def trimmed(fn, rows):
        def run():
            out = fn()
            mx.eval(out)
            target.rollback(kept=0, fed=rows)
            return out

        return run

    parts = {
        "plain_step": costs(lambda: trimmed(step, 1)(), args.repeats),
        "verify": costs(lambda: trimmed(verify, B)(), args.repeats),
        "draft_forward": costs(draft_forward, args.repeats),
        "draft_layers": costs(layers, args.repeats),
        "draft_head": costs(draft_head, args.repeats),
        "context_extend": costs(extend, args.repeats),
    }
    # the trimmed parts evaluate inside build(): count them without it, and take their total only
    for name, fn in (("plain_step", step), ("verify", verify)):
        out = fn()
        ops = operations(out)
        mx.eval(out)
        target.rollback(kept=0, fed=1 if name == "plain_step" else B)
        parts[name].update(operations=sum(ops.values()), top=dict(ops.most_common(12)), build_ms=None)
    plain = parts["plain_step"]["ms"]
    for v in parts.values():
        v["in_plain_steps"] = round(v["ms"] / plain, 2)

    # a whole run, profiled: where the host's time goes, by Python function
    prof = cProfile.Profile()
    prompt = pair.encode(PROMPT, pair.chat_default)
    list(pair.dflash(prompt, 64, B, policy="fixed"))  # warm-up
    prof.enable()
    summary = [e for e in pair.dflash(prompt, 128, B, policy="fixed")][-1]
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).strip_dirs().sort_stats("tottime").print_stats(30)
    res = {
        "device": str(mx.default_device()),
        "dtype": str(pair.compute_dtype or "the weights' own"),
        "block_size": B,
        "parts": parts,
        "run": {"tokens": len(summary.tokens), "cycles": summary.cycles, "decode_s": round(summary.decode_s, 4)},
        "profile_by_tottime": s.getvalue().splitlines()[:60],
    }
    text = json.dumps(res, indent=1)
    print(text)
    if args.save:
        Path(args.save).write_text(text)


if __name__ == "__main__":
    main()
