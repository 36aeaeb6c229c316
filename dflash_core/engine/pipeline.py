"""The speculative cycle without waiting for its outcome: while the device runs cycle N, the host
builds and launches cycle N + 1, then reads cycle N back.

A cycle's next draft needs its accepted length, which a synchronous cycle reads on the host, so
the device idles while the host builds the next graph: on an H100 a verify of 8 rows cost 1.85
plain steps (docs/benchmarks.md), with only 29 operations more than a step, whose next graph is
built while it computes. Here acceptance is computed on the device, the staged token is
taken there, and the caches keep their length there (dflash_core.engine.device_cache), so cycle
N + 1 is built on cycle N's outputs before they exist. The policy decides each cycle from the
cycles read so far: one behind. Its plain steps run here too, on the same caches, so a run that
moves between drafting and plain steps never drains the pipeline nor converts its caches.

Greedy only; targets whose caches are all mlx-lm's KVCache; drafts without sliding layers.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import mlx.core as mx

from .events import Decision, plain_step_fields
from .policy import Policy


def accepted_length_on_device(proposals: mx.array, posterior: mx.array) -> mx.array:
    """cycle.accepted_length as an array: sum(cumprod(proposals == posterior[:-1]))."""
    agree = (proposals == posterior[: proposals.shape[0]]).astype(mx.int32)
    return mx.sum(mx.cumprod(agree))


@dataclass
class Launched:
    """A cycle on its way: its decision, and its outputs as arrays not yet read. A plain step has
    no `drafted` nor `accepted`; its confidence is the target's probability of its token."""

    decision: Decision
    verified: int
    drafted: mx.array | None  # the whole block's proposals; the first `verified` are verified
    confidence: mx.array  # the draft's probability of each
    posterior: mx.array
    accepted: mx.array | None
    next_staged: mx.array
    launch_ms: float  # the host's time to build and launch the cycle's graph


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
    compiled: bool = False,
):
    """The run's cycles from `staged`, drafted ones and plain steps as the policy decides, until
    `stopped()`. Each cycle goes to `record(**fields)` (cycle.dflash_generate's) and its event is
    yielded; returns the staged token. `budget()`: tokens still to commit. `oracle`: a
    cycle.OracleDraft proposes instead of the draft. `compiled`: the cycles run as compiled graphs
    (CompiledCycles). At the end the caches are mlx-lm's again, holding every kept token."""
    B, mask_id = rule.B, draft.config.mask_token_id
    held = target.cache[0].offset  # the target cache's (and the draft context's) length, as read so far
    graphs = compiled_cycles(target, draft, head, B, oracle is not None) if compiled else None
    # a compiled cycle's caches have one size for the run: every position it may write (the
    # budget, and the rows of the two cycles in flight)
    positions = held + budget() + 3 * (B + 1)
    capacity = None if graphs is None else capacity_for(positions)
    target_length, ctx_length = target.on_device(capacity), ctx.on_device(capacity)
    # what a cycle's graph reads besides the caches: an oracle's proposals by context position
    inputs = [] if oracle is None else [oracle.by_position(capacity or positions)]

    def device_work(v: int, first: mx.array, *by_position) -> tuple:
        """The cycle's graph from the staged token `first` (1,), v proposals verified: its outputs
        as arrays, both caches advanced by the kept rows on the device."""
        if oracle is not None:  # the target's own continuation, as sure as can be
            drafted = oracle.on_device(target_length.offset, B - 1, *by_position).astype(first.dtype)
            sure = mx.ones(B - 1)
        else:  # draft: one forward over [staged, MASK x (B-1)]
            block = target.embed(mx.concatenate([first, mx.full((B - 1,), mask_id, dtype=first.dtype)]))[None]
            logits = head.logits(draft.propose(block, ctx.kv, ctx.length, ctx.visible(B))[:, 1:])[0]
            drafted = head.token_ids(mx.argmax(logits, axis=-1)).astype(first.dtype)
            sure = mx.exp(mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1))
        # verify: one target forward over [staged, d0 .. d(v-1)]
        proposals = drafted[:v]
        logits, taps = target.verify(mx.concatenate([first, proposals]) if v else first)
        posterior = mx.argmax(logits, axis=-1).astype(first.dtype)
        # accept, commit and roll back on the device: both caches advance by the kept rows only
        # (no scan over nothing where v = 0: MLX's CUDA kernels fault on empty arrays)
        accepted = accepted_length_on_device(proposals, posterior) if v else mx.array(0, dtype=first.dtype)
        target_length.advance(accepted + 1, v + 1)
        ctx.extend(taps, kept=accepted + 1)
        return drafted, sure, posterior, accepted, mx.take(posterior, accepted)

    def plain_work(first: mx.array, *_) -> tuple:
        """A plain step's graph: the target checks the staged token alone (no draft forward); its
        taps still extend the draft's context, so that the next drafted cycle can draft."""
        logits, taps = target.step(first)
        token = mx.argmax(logits, keepdims=True).astype(first.dtype)
        sure = mx.exp(mx.max(logits) - mx.logsumexp(logits)).reshape(1)
        target_length.advance(1, 1)
        ctx.extend(taps, kept=1)
        return sure, token, token[0]

    # every graph a cycle may take: a plain step, or a drafted cycle verifying v proposals
    works = {"plain": (plain_work, 1), **{v: (partial(device_work, v), v + 1) for v in range(B)}}
    if graphs is not None:  # before the first cycle is timed
        graphs.prepare(works, target, ctx, (mx.array([staged], dtype=mx.int32), *inputs))

    def launch(decision: Decision, staged_token: mx.array, room: int) -> Launched:
        """Cycle on its way; `room`: the tokens the budget surely has left when it commits (the
        last cycle verifies no more proposals than fit after its staged token)."""
        t = time.perf_counter()
        key = "plain" if decision.plain_step else min(decision.verified, room - 1)
        v = 0 if decision.plain_step else key
        args = (staged_token.reshape(1), *inputs)
        outputs = works[key][0](*args) if graphs is None else graphs.run(works, key, target, ctx, args)
        # the draft context's caches too: nothing a plain step returns reads them, so left out,
        # each plain step's extension stayed pending until the next draft forward, which then
        # ran them all one after another (on an H100 a drafted cycle after 100 plain steps took
        # 160 ms where drafting's cycles take 5-9, and the policy kept such runs plain)
        mx.async_eval(*outputs, target_length.offset, ctx.length, *(x for kv in ctx.kv for x in kv))
        if decision.plain_step:  # in Launched's order: no drafted block, no accepted count
            sure, token, next_staged = outputs
            outputs = (None, sure, token, None, next_staged)
        return Launched(decision, v, *outputs, (time.perf_counter() - t) * 1e3)

    streak = None  # the Decision of the plain steps in progress (each plain step carries it)

    def decide(after_plain: bool) -> Decision:
        """The next cycle's decision, as the synchronous loop would make it: after a plain step,
        plain steps go on while keep_plain says so (asked with one step in flight)."""
        nonlocal streak
        if after_plain and rule.keep_plain():
            return streak
        streak = None if after_plain else rule.before_draft()
        return streak or rule.after_draft(None)

    # A cycle's time is the host's launch of it plus the wait for its outputs. Between two reads
    # the host launches the next cycle ahead, then waits for this one: that launch is the next
    # cycle's (it is carried to it), or the last plain step before a drafted cycle would be charged
    # with building the drafted graph, and the cost model, taking plain steps for dear and drafted
    # cycles for cheap, would go on drafting where nothing is accepted.
    t_read = time.perf_counter()
    inflight = launch(decide(False), mx.array(staged, dtype=mx.int32), budget())
    carried_ms = 0.0  # the launch of the cycle in flight, where an earlier interval timed it
    while True:
        # the next cycle, built on this one's outputs, except after a probe (a drafted cycle after
        # plain steps), whose outcome decides whether drafting goes on; where the budget may end
        # within this one (it commits 1 to verified + 1 tokens) the next waits, to verify only what
        # fits
        c, ahead, waiting = inflight, None, None
        plain = c.decision.plain_step
        probe = not plain and rule.plain_streak > 0  # the cycles read so far end in plain steps
        if not probe:
            decision = decide(plain)
            room = budget() - c.verified - 1
            if room > decision.verified:
                ahead = launch(decision, c.next_staged, room)
            else:
                waiting = decision
        confidence, posterior, nxt = c.confidence.tolist(), c.posterior.tolist(), c.next_staged.item()
        now = time.perf_counter()
        ahead_ms = ahead.launch_ms if ahead else 0.0
        cycle_ms = (now - t_read) * 1e3 - ahead_ms + carried_ms
        t_read, carried_ms = now, ahead_ms
        if plain:
            held += 1
            yield record(**plain_step_fields([staged], nxt, confidence[0], c.decision, cycle_ms, now - t0))
        else:
            drafted, a = c.drafted.tolist(), c.accepted.item()
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
                draft_ms=min(c.launch_ms, cycle_ms),  # the host's part; the device's shows as the verify's
                verify_ms=max(0.0, cycle_ms - c.launch_ms),
                rollback_ms=0.0,
                t=now - t0,
                decision=c.decision,
            )
        staged = nxt
        if stopped():
            mx.synchronize()  # a cycle launched ahead of the end is this run's work
            break
        inflight = ahead or launch(waiting or decide(plain), c.next_staged, budget())
    target.off_device(held)
    ctx.off_device(held)
    return staged


# ---------------------------------------------------------------------------------------------
# Compiled cycles. A small target's step on a GPU is the host's time: Python building a graph of
# ~800 operations, then their launches. With caches of a fixed size (device_cache's `capacity`) a
# drafted cycle's graph has the same shapes every time, so mx.compile records it once and each
# call replays it (no Python per operation, elementwise chains fused into single kernels).
# ---------------------------------------------------------------------------------------------


CAPACITY_STEP = 4096


def capacity_for(positions: int) -> int:
    """The fixed cache size for a run that writes up to `positions`, so that runs of similar length
    share their compiled graphs: a power of two from 512 to CAPACITY_STEP, then a multiple of it
    (a long context's cache is large: doubling it would waste up to half)."""
    if positions > CAPACITY_STEP:
        return -(-positions // CAPACITY_STEP) * CAPACITY_STEP
    return max(512, 1 << (positions - 1).bit_length())


def _state(target, ctx) -> list:
    """What a cycle reads and writes: both lengths, then every cache buffer."""
    caches = target.cache + ctx.caches
    return [caches[0].length.offset, ctx.device_length.offset] + [x for c in caches for x in (c.keys, c.values)]


def _load(target, ctx, state: list):
    """Put `state` (as _state lists it) into the caches."""
    target_offset, ctx_offset, *buffers = state
    target.cache[0].length.set(target_offset)
    ctx.device_length.set(ctx_offset)
    ctx.length = ctx_offset
    for c, k, v in zip(target.cache + ctx.caches, buffers[::2], buffers[1::2]):
        c.keys, c.values = k, v
    ctx.kv = [(c.keys, c.values) for c in ctx.caches]


class CompiledCycles:
    """A pair's cycles (pipelined_cycles' device_work and plain_work) as compiled graphs, one per
    verified count and one for a plain step: the state goes in and comes out as arrays. A graph
    holds the weights it was traced with, so one of these serves one (target, draft, head, block)."""

    def __init__(self):
        self._graphs = {}  # verified count, or "plain" -> the compiled function
        self._run = None  # (device_work, target, ctx) of the call being traced
        self._warm = False
        self._sizes = set()  # the cache sizes at which every graph has been traced and run
        self.traces = 0  # graphs traced: one per key and cache size, however many runs

    def _graph(self, key):
        graph = self._graphs.get(key)
        if graph is None:

            def traced(*args_and_state):
                self.traces += 1
                work, tgt, cx, n_args = self._run
                _load(tgt, cx, args_and_state[n_args:])
                outputs = work(*args_and_state[:n_args])  # before the state it leaves
                return [*_state(tgt, cx), *outputs]

            graph = self._graphs[key] = mx.compile(traced)
        return graph

    def _call(self, key, work, target, ctx, args: tuple) -> tuple:
        """(the state the graph leaves, work's outputs); a trace leaves its placeholders in the
        caches, for the caller to replace."""
        state = _state(target, ctx)
        self._run = (work, target, ctx, len(args))
        try:
            out = self._graph(key)(*args, *state)
        finally:
            self._run = None
        return out[: len(state)], out[len(state) :]

    def prepare(self, works: dict, target, ctx, args: tuple):
        """Trace and run every graph of `works` (key -> (work, rows fed)) at the caches' present
        size, where not done yet, leaving the caches as they were; `args`: a cycle's (a staged
        token and what else it reads). Traced on demand instead, a graph's trace (the host
        building and fusing its ~800 operations) and its kernels' first compilation would fall
        inside the cycle that first takes it, which the policy would time as that cycle's cost;
        the adaptive policy takes up to B + 1 graphs a run, the fixed rule two or three."""
        size = target.cache[0].keys.shape[2]
        if size in self._sizes:
            return
        self._sizes.add(size)
        bounds = target.cache[0].length.bound, ctx.device_length.bound
        state = _state(target, ctx)

        def restore():  # the caches and the host's bounds of their length, as they were
            _load(target, ctx, state)
            target.cache[0].length.bound, ctx.device_length.bound = bounds

        for key, (work, _) in works.items():
            if not self._warm:
                # each work runs as it is once a process first: that evaluates what runs once
                # (the fused attention's self-checks), which a trace may not
                mx.eval(work(*args))
                restore()
            mx.eval(self._call(key, work, target, ctx, args))
            restore()
        self._warm = True

    def run(self, works: dict, key, target, ctx, args: tuple) -> tuple:
        """The outputs of works[key] = (work, rows fed) on `args` (the staged token and what else
        the graph reads: inputs, not constants, so that a graph serves every run of its shapes),
        its state updates made as the work would make them."""
        work, fed = works[key]
        bounds = target.cache[0].length.bound, ctx.device_length.bound
        state, outputs = self._call(key, work, target, ctx, args)
        _load(target, ctx, state)
        # the host's bounds advance as the work's would (a replay runs no Python)
        target.cache[0].length.bound, ctx.device_length.bound = (b + fed for b in bounds)
        return tuple(outputs)


def compiled_cycles(target, draft, head, B: int, oracle: bool = False) -> CompiledCycles:
    """The CompiledCycles of this pair and block (or of an oracle's cycles at this block), made once
    (kept on the target, with the draft and head it was made for)."""
    key = (id(draft), id(head), B, oracle)
    kept = target.compiled_cycles.get(key)
    if kept is None:
        kept = target.compiled_cycles[key] = (draft, head, CompiledCycles())
    return kept[2]
