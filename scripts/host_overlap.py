"""Whether the host's graph building overlaps the device's work, for a real pair: plain decoding
steps and the cycle's forwards run eagerly (build, evaluate, read) against pipelined (build the
next while the last one runs, then read the last), side by side in one process, medians.

On a GPU a small target's step is bound by the host (building the graph in Python, launching
kernels), so a cycle that syncs with the host once per cycle pays its graph building with the
device idle; this says how much of that a pipelined cycle could win back.

    python scripts/host_overlap.py --save out.json
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

from dflash_core.engine.draft import DraftContext  # noqa: E402
from dflash_core.loading import load_pair  # noqa: E402

PROMPT = "Why is the sky blue during the day but red at sunset? Explain in detail."


def per_iteration_ms(fn, n: int) -> float:
    t = time.perf_counter()
    fn(n)
    return (time.perf_counter() - t) * 1e3 / n


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model")
    p.add_argument("--draft")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--save")
    args = p.parse_args()
    pair = load_pair(args.model, args.draft, allow_download=False)
    target, draft = pair.target, pair.draft
    B, mask_id = pair.block_size, draft.config.mask_token_id
    head = target.draft_head(pair.draft_vocab)
    ids = pair.encode(PROMPT, pair.chat_default)
    ids = (ids * (300 // len(ids) + 1))[:300]
    ctx = DraftContext(draft)

    def reset():
        nonlocal ctx
        ctx = DraftContext(draft)
        target.prefill(ids, on_taps=ctx.extend)
        mx.eval([c.state for c in target.cache], *[x for kv in ctx.kv for x in kv])

    def plain_eager(n):
        tok = mx.array([1])
        for _ in range(n):
            logits, _ = target.step(tok)
            tok = mx.argmax(logits, axis=-1, keepdims=True)
            tok.item()

    def plain_pipelined(n):
        logits, _ = target.step(mx.array([1]))
        tok = mx.argmax(logits, axis=-1, keepdims=True)
        mx.async_eval(tok)
        for _ in range(n):
            logits, _ = target.step(tok)
            nxt = mx.argmax(logits, axis=-1, keepdims=True)
            mx.async_eval(nxt)
            tok.item()
            tok = nxt
        tok.item()

    def draft_forward():
        block = target.embed(mx.array([1] + [mask_id] * (B - 1)))[None]
        logits = head.logits(draft.propose(block, ctx.kv, ctx.length)[:, 1:])[0]
        return head.token_ids(mx.argmax(logits, axis=-1))

    def verify(proposals):  # keeps every row: no host-dependent rollback
        logits, taps = target.verify(mx.concatenate([mx.array([1]), proposals[: B - 1]]))
        ctx.extend(taps)
        return mx.argmax(logits, axis=-1)

    def draft_only(n):
        for _ in range(n):
            draft_forward().tolist()

    def cycle_eager(n):
        for _ in range(n):
            verify(draft_forward()).tolist()

    def cycle_draft_launched(n):  # the draft's graph launched before the verify's is built
        for _ in range(n):
            proposals = draft_forward()
            mx.async_eval(proposals)
            verify(proposals).tolist()

    def cycle_pipelined(n):  # cycle k+1 built and launched before cycle k is read
        last = verify(draft_forward())
        mx.async_eval(last)
        for _ in range(n):
            nxt = verify(draft_forward())
            mx.async_eval(nxt)
            last.tolist()
            last = nxt
        last.tolist()

    def build_ms(fn, n=20) -> float:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            arrays = fn()
            out.append((time.perf_counter() - t) * 1e3)
            mx.eval(arrays)
        return median(out)

    variants = {
        "plain_eager": plain_eager,
        "plain_pipelined": plain_pipelined,
        "draft_only": draft_only,
        "cycle_eager": cycle_eager,
        "cycle_draft_launched": cycle_draft_launched,
        "cycle_pipelined": cycle_pipelined,
    }
    times = {k: [] for k in variants}
    for r in range(args.repeats + 1):  # the first round warms up
        for name, fn in variants.items():  # interleaved, so that the machine's drift hits all alike
            reset()
            ms = per_iteration_ms(fn, args.steps if name.startswith("plain") else args.steps // B)
            if r:
                times[name].append(ms)
    reset()
    res = {
        "device": str(mx.default_device()),
        "dtype": str(pair.compute_dtype or "the weights' own"),
        "block_size": B,
        "ms": {k: round(median(v), 3) for k, v in times.items()},
        "build_ms": {
            "draft": round(build_ms(draft_forward), 3),
            "step": round(build_ms(lambda: target.step(mx.array([1]))[0]), 3),
        },
    }
    res["build_ms"]["verify"] = round(build_ms(lambda: verify(mx.array([1] * (B - 1)))), 3)
    plain = res["ms"]["plain_pipelined"]
    res["in_plain_steps"] = {k: round(v / plain, 2) for k, v in res["ms"].items()}
    text = json.dumps(res, indent=1)
    print(text)
    if args.save:
        Path(args.save).write_text(text)


if __name__ == "__main__":
    main()
