"""The speculative cycle without waiting for its outcome: while the device runs cycle N, the host
builds and launches cycle N + 1, then reads cycle N back.

A cycle's next draft needs its accepted length, which a synchronous cycle reads on the host, so
the device idles while the host builds the next graph: on a GPU a cycle then cost about what a
plain step costs twice (docs/benchmarks.md), where a plain step overlaps its next graph's
building with its own computing. Here acceptance is computed on the device, the staged token is
taken there, and the caches keep their length there (dflash_core.engine.device_cache), so cycle
N + 1 is built on cycle N's outputs before they exist. The policy decides each cycle from the
cycles read so far: one behind.

Greedy only; targets whose caches are all mlx-lm's KVCache; drafts without sliding layers.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from .events import Decision
from .policy import Policy


def accepted_length_on_device(proposals: mx.array, posterior: mx.array) -> mx.array:
    """cycle.accepted_length as an array: sum(cumprod(proposals == posterior[:-1]))."""
    agree = (proposals == posterior[: proposals.shape[0]]).astype(mx.int32)
    return mx.sum(mx.cumprod(agree))


@dataclass
class Launched:
    """A cycle on its way: its decision, and its outputs as arrays not yet read."""

    decision: Decision
    verified: int
    proposals: mx.array | None  # None: a plain step
    confidence: mx.array  # the draft's probability of each proposal; a plain step: the target's of its token
    posterior: mx.array
    accepted: mx.array
    next_staged: mx.array
    draft_ms: float  # the host's time to build the draft's part of the graph


def pipelined_cycles(
    target,
    draft,
    head,
    ctx,
    rule: Policy,
    staged: int,
    record: Callable,
    stopped: Callable[[], bool],
    budget: Callable[[], int],
    prompt_len: int,
    t0: float,
):
    """Cycles until `stopped()`, each handed to `record(**fields)` (cycle.dflash_generate's) and
    its event yielded. `budget()`: tokens still to commit. At the end the caches are mlx-lm's
    again, holding the prompt and each cycle's kept tokens."""
    B, mask_id = rule.B, draft.config.mask_token_id
    target_length, ctx_length = target.on_device(), ctx.on_device()
    held = prompt_len  # the target cache's (and the draft context's) length, as read so far

    def launch(decision: Decision, staged_token: mx.array) -> Launched:
        t = time.perf_counter()
        first = staged_token.reshape(1)
        if decision.plain_step:
            proposals, v = None, 0
            ids = first
        else:
            # draft: one forward over [staged, MASK x (B-1)]
            block = target.embed(mx.concatenate([first, mx.full((B - 1,), mask_id, dtype=first.dtype)]))[None]
            logits = head.logits(draft.propose(block, ctx.kv, ctx.length, ctx.visible(B))[:, 1:])[0]
            v = decision.verified
            proposals = head.token_ids(mx.argmax(logits, axis=-1))[:v].astype(first.dtype)
            sure = mx.exp(mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1))[:v]
            ids = mx.concatenate([first, proposals])
        t_draft = time.perf_counter()
        # verify: one target forward over [staged, d0 .. d(v-1)]
        logits, taps = target.verify(ids)
        posterior = mx.argmax(logits, axis=-1).astype(first.dtype)
        if proposals is None:
            accepted = mx.array(0, dtype=mx.int32)
            sure = mx.exp(mx.max(logits[0]) - mx.logsumexp(logits[0])).reshape(1)
        else:
            accepted = accepted_length_on_device(proposals, posterior)
        nxt = mx.take(posterior, accepted)
        # commit and roll back on the device: both caches advance by the kept rows only
        target_length.advance(accepted + 1, v + 1)
        ctx.extend(taps, kept=accepted + 1)
        out = [x for x in (proposals, sure, posterior, accepted, nxt) if x is not None]
        mx.async_eval(*out, target_length.offset, ctx.length)
        return Launched(decision, v, proposals, sure, posterior, accepted, nxt, (t_draft - t) * 1e3)

    def decide(last: Decision) -> Decision:
        if last.plain_step and rule.keep_plain():
            return last
        if not last.plain_step:
            plain = rule.before_draft()
            if plain is not None:
                return plain
        return rule.after_draft(None)

    decision = rule.before_draft() or rule.after_draft(None)
    inflight = launch(decision, mx.array(staged, dtype=mx.int32))
    t_read = time.perf_counter()
    while True:
        # the next cycle, built on this one's outputs, unless this one surely ends the run (it
        # commits one token at least, and the next staged one where that fills the budget)
        ahead = launch(decide(inflight.decision), inflight.next_staged) if budget() > 2 else None
        c = inflight
        drafted = [] if c.proposals is None else c.proposals.tolist()
        confidence, posterior = c.confidence.tolist(), c.posterior.tolist()
        a, nxt = c.accepted.item(), c.next_staged.item()
        now = time.perf_counter()
        cycle_ms = (now - t_read) * 1e3  # one cycle's share of the pipeline's time
        t_read = now
        target_length.settle(c.verified - a)
        ctx_length.settle(c.verified - a)
        held += a + 1
        yield record(
            staged_token=staged,
            drafted=drafted,
            confidence=confidence,
            verified=c.verified,
            posterior=posterior,
            accepted_len=a,
            committed=[staged] + drafted[:a],
            next_staged=nxt,
            kv_trimmed=c.verified - a,
            gdn_replayed=0,
            draft_ms=min(c.draft_ms, cycle_ms),
            verify_ms=max(0.0, cycle_ms - c.draft_ms),
            rollback_ms=0.0,
            t=now - t0,
            decision=c.decision,
        )
        staged = nxt
        if stopped():
            break
        inflight = ahead or launch(decide(c.decision), c.next_staged)
    mx.synchronize()  # a cycle launched ahead of the end is this run's work
    target.off_device(held)
    ctx.off_device(held)
