"""The speculative cycle without waiting for its outcome: while the device runs cycle N, the host
builds and launches cycle N + 1, then reads cycle N back.

A cycle's next draft needs its accepted length, which a synchronous cycle reads on the host, so
the device idles while the host builds the next graph: on an H100 a verify of 8 rows cost 1.85
plain steps (docs/benchmarks.md), with only 29 operations more than a step, whose next graph is
built while it computes. Here acceptance is computed on the device, the staged token is
taken there, and the caches keep their length there (dflash_core.engine.device_cache), so cycle
N + 1 is built on cycle N's outputs before they exist. The policy decides each cycle from the
cycles read so far: one behind. Plain steps stay the synchronous loop's (cycle.dflash_generate):
they are pipelined already, as plain decoding's are.

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
    proposals: mx.array
    confidence: mx.array  # the draft's probability of each proposal
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
    t0: float,
    oracle=None,
):
    """Drafted cycles from `staged`, until `stopped()` or until the policy would step plainly
    (plain steps are the synchronous loop's: pipelined already, and without the drafted cycle's
    device-side bookkeeping). Each cycle goes to `record(**fields)` (cycle.dflash_generate's) and
    its event is yielded; returns the staged token. `budget()`: tokens still to commit. `oracle`:
    a cycle.OracleDraft proposes instead of the draft. At the end the caches are mlx-lm's again,
    holding every kept token."""
    B, mask_id = rule.B, draft.config.mask_token_id
    held = target.cache[0].offset  # the target cache's (and the draft context's) length, as read so far
    target_length, ctx_length = target.on_device(), ctx.on_device()

    def launch(decision: Decision, staged_token: mx.array) -> Launched:
        t = time.perf_counter()
        first, v = staged_token.reshape(1), decision.verified
        if oracle is not None:  # the target's own continuation, as sure as can be
            proposals, sure = oracle.on_device(target_length.offset, v).astype(first.dtype), mx.ones(v)
        else:  # draft: one forward over [staged, MASK x (B-1)]
            block = target.embed(mx.concatenate([first, mx.full((B - 1,), mask_id, dtype=first.dtype)]))[None]
            logits = head.logits(draft.propose(block, ctx.kv, ctx.length, ctx.visible(B))[:, 1:])[0]
            proposals = head.token_ids(mx.argmax(logits, axis=-1))[:v].astype(first.dtype)
            sure = mx.exp(mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1))[:v]
        t_draft = time.perf_counter()
        # verify: one target forward over [staged, d0 .. d(v-1)]
        logits, taps = target.verify(mx.concatenate([first, proposals]))
        posterior = mx.argmax(logits, axis=-1).astype(first.dtype)
        # accept, commit and roll back on the device: both caches advance by the kept rows only
        accepted = accepted_length_on_device(proposals, posterior)
        nxt = mx.take(posterior, accepted)
        target_length.advance(accepted + 1, v + 1)
        ctx.extend(taps, kept=accepted + 1)
        mx.async_eval(proposals, sure, posterior, accepted, nxt, target_length.offset, ctx.length)
        return Launched(decision, v, proposals, sure, posterior, accepted, nxt, (t_draft - t) * 1e3)

    def next_decision() -> Decision | None:
        """The next cycle's decision, or None where the policy steps plainly next."""
        return None if rule.before_draft() is not None else rule.after_draft(None)

    t_read = time.perf_counter()
    inflight = launch(rule.after_draft(None), mx.array(staged, dtype=mx.int32))
    while True:
        # the next cycle, built on this one's outputs; not where this one surely ends the run (it
        # commits a token at least, and the next staged one where that fills the budget), nor
        # after a probe (plain_streak > 0), whose outcome decides whether drafting goes on
        ahead = None
        if budget() > 2 and not rule.plain_streak:
            decision = next_decision()
            ahead = None if decision is None else launch(decision, inflight.next_staged)
        c = inflight
        drafted, confidence, posterior = c.proposals.tolist(), c.confidence.tolist(), c.posterior.tolist()
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
            mx.synchronize()  # a cycle launched ahead of the end is this run's work
            break
        if ahead is None:
            decision = next_decision()
            if decision is None:
                break
            ahead = launch(decision, c.next_staged)
        inflight = ahead
    target.off_device(held)
    ctx.off_device(held)
    return staged
