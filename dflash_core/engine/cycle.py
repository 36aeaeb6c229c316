"""The speculative cycle and the plain greedy baseline, both yielding plain events."""

import os
import time
from collections.abc import Callable, Iterator

import mlx.core as mx
from mlx_lm.generate import generate_step, generation_stream

from .. import backend
from . import fused_attention
from .copy_source import MAX_COPY, CopySource
from .draft import DraftContext, DraftModel
from .events import CycleEvent, CycleTally, Divergence, RunSummary, TokenEvent, plain_step_fields
from .pipeline import pipelined_cycles
from .policy import AcceptancePredictor, CostModel, Policy, probe_costs
from .prefix_cache import PrefixCache, held_length, prefill
from .sampling import Sampling, point_mass, sample, speculative_accept
from .target import Target


def accepted_length(drafted: list, posterior: list) -> int:
    """sum(cumprod(drafted == posterior[:-1])): the longest agreeing prefix. A later match after
    a mismatch is never accepted."""
    a = 0
    while a < len(drafted) and drafted[a] == posterior[a]:
        a += 1
    return a


PROBE_CONTEXT = 64  # prompt tokens the cost probe runs on
PIPELINE_ENV = "DFLASH_PIPELINE"
COMPILE_ENV = "DFLASH_COMPILE_CYCLE"


def _switch(env: str) -> bool:
    """An engine switch: its environment variable (0 or 1), or else on where it was measured faster
    side by side: CUDA GPUs. On the 40 held-out requests on an H100 (2 repeats), pipelined cycles
    compiled (both switches) read 1.59x median with the adaptive policy against 1.19x for the
    synchronous cycle in the same run, every output identical (docs/benchmarks.md). On a CPU the
    host cannot overlap the device (MLX's CPU backend evaluates inside async_eval), and Metal has
    not been measured."""
    value = os.environ.get(env)
    if value in ("0", "1"):
        return value == "1"
    return fused_attention.gpu_backend() == "cuda"


def pipeline_default() -> bool:
    """Whether runs pipeline their cycles where they can (dflash_core.engine.pipeline):
    DFLASH_PIPELINE, else on CUDA."""
    return _switch(PIPELINE_ENV)


def compile_default() -> bool:
    """Whether pipelined cycles run as compiled graphs (pipeline.CompiledCycles):
    DFLASH_COMPILE_CYCLE, else on CUDA."""
    return _switch(COMPILE_ENV)


def _finish(tokens: list, new: list, max_tokens: int, eos: set):
    """Append new tokens up to max_tokens or the first EOS; return the stop reason or None."""
    for tok in new:
        tokens.append(tok)
        if tok in eos:
            return "eos"
        if len(tokens) >= max_tokens:
            return "max_tokens"
    return None


def dflash_generate(
    target: Target,
    draft: DraftModel,
    prompt_ids: list,
    *,
    max_tokens: int,
    block_size: int,
    eos_ids: set,
    should_stop: Callable[[], bool] = lambda: False,
    draft_fn: Callable | None = None,
    policy: str = "adaptive",
    min_confidence: float = 0.0,
    cost_profiles: dict | None = None,
    acceptance_prior: dict | None = None,
    sampling: Sampling | None = None,
    draft_vocab: tuple | None = None,
    plain_threads: int | None = None,
    prefix_cache: PrefixCache | None = None,
    copy: bool = False,
    pipelined: bool | None = None,
    compiled: bool | None = None,
) -> Iterator:
    """Yields one CycleEvent per cycle, then a RunSummary. `policy` "adaptive" lets the cost
    model decide each cycle between a plain target step and drafting, and how many proposals to
    verify; "fixed" verifies the whole block, or with min_confidence > 0 only the proposals the
    draft is sure of (see policy.confident_prefix). `cost_profiles`: the pair's cache of probed costs
    (dflash_core.engine.policy.probe_costs), filled here when this block size has none;
    `acceptance_prior`: the draft's shipped acceptance figures (Pair.acceptance_prior). `draft_fn(ctx_tokens, B)`
    replaces the draft model's proposals (the oracle mode of the benchmark and the tests). With
    `sampling` the draft samples its proposals and acceptance is speculative sampling
    (sampling.speculative_accept); without, everything is greedy. With `draft_vocab` the draft
    proposes only those tokens (its DraftConfig.draft_vocab; see Target.draft_head).
    `plain_threads`: the BLAS threads plain steps run on (plain decoding's fastest, where measured:
    a plain step is plain decoding's step, which may prefer other threads than a drafted cycle).
    `prefix_cache`: prefill starts from the longest cached prefix of the prompt, and the run's
    prompt and its end are snapshot there (dflash_core.engine.prefix_cache). `copy`: tokens copied from
    the context (dflash_core.engine.copy_source) go to the target instead of the draft's block where
    the policy expects more of them, or alone (no draft forward) where they promise more than
    drafting would. `pipelined`: cycles launched before the last one is read back
    (dflash_core.engine.pipeline), where the run allows it (greedy, no copies, plain attention
    caches, no fixed confidence threshold); None: pipeline_default(). `compiled`: a pipelined run's
    cycles as compiled graphs; None: compile_default()."""
    B, mask_id = block_size, draft.config.mask_token_id
    head = target.draft_head(draft_vocab)
    profiles = {} if cost_profiles is None else cost_profiles
    most_rows = max(B, MAX_COPY + 1) if copy else B  # a copy may verify more rows than a block
    key = (B, draft_vocab is not None, backend.blas_threads(), most_rows)
    if key not in profiles:
        profiles[key] = probe_costs(target, draft, head, B, prompt_ids[:PROBE_CONTEXT], most_rows)
    threshold = None if policy == "adaptive" else min_confidence
    # a fixed --min-confidence reads the draft's confidences before it verifies: no pipeline
    proposes_on_device = draft_fn is None or hasattr(draft_fn, "on_device")  # OracleDraft does
    pipelinable = target.plain_kv() and proposes_on_device and not (sampling or copy or draft.slides or threshold)
    pipelined = pipelinable and (pipeline_default() if pipelined is None else pipelined)
    compiled = pipelined and proposes_on_device and (compile_default() if compiled is None else compiled)
    rule = Policy(
        B,
        CostModel(profiles[key], way=(compiled, draft_fn is None) if pipelined else None),
        AcceptancePredictor(B, None if sampling else acceptance_prior),
        threshold,
        reads_confidence=backend.on_cpu(),
    )
    mx.reset_peak_memory()
    if sampling:
        sampling.seed_draws()
    ctx = DraftContext(draft)
    t_start = time.perf_counter()
    first, reused = prefill(target, ctx, prompt_ids, prefix_cache)
    staged = sample(sampling.probabilities(first)) if sampling else mx.argmax(first).item()
    t0 = time.perf_counter()
    tokens, tally = [], CycleTally(B)
    copies = CopySource(prompt_ids) if copy else None
    stop = None

    def record(**cycle) -> CycleEvent:
        """The cycle's event, after committing its tokens (cut at EOS / max tokens)."""
        nonlocal stop
        n_before, committed = len(tokens), cycle["committed"]
        if n_before + len(committed) + 1 >= max_tokens or cycle["next_staged"] in eos_ids:
            # the run ends on the next staged token (the budget's last, or an EOS): emit it with
            # this cycle instead of after one more draft + verify
            committed = committed + [cycle["next_staged"]]
        stop = _finish(tokens, committed, max_tokens, eos_ids)
        if stop is None and should_stop():
            stop = "cancelled"
        event = CycleEvent(cycle=tally.cycles, block_size=B, **cycle | {"committed": tokens[n_before:]})
        if event.source == "copy":  # the draft's and the cost model's statistics are the draft's own
            copies.observe(event)
        else:
            rule.observe(event, event.cycle_ms / 1e3)
        if copies:
            copies.extend(event.committed)
        tally.add(event)
        return event

    if pipelined:  # every cycle, drafted or plain, launched before the last one is read
        staged = yield from pipelined_cycles(
            target,
            draft,
            head,
            ctx,
            rule,
            staged,
            record,
            stopped=lambda: stop is not None,
            budget=lambda: max_tokens - len(tokens),
            t0=t0,
            oracle=draft_fn,
            compiled=compiled,
        )
    while stop is None:
        t = time.perf_counter()
        copied = copies.propose(staged, most_rows - 1) if copies else None
        p_copied = copies.p_tokens(copied) if copied else None
        # a copy that promises more than drafting would is verified alone: no draft forward
        alone = rule.copy_alone(p_copied, copies.reason(copied)) if copied else None
        decision = alone or rule.before_draft()
        if decision is not None and decision.plain_step:
            # plain steps, until the policy drafts again: no draft forward; the target checks the
            # staged token alone
            t_step, own_launch_s, pending, threads = t, 0.0, [], backend.blas_threads()
            if plain_threads and threads:
                backend.set_blas_threads(plain_threads)
            for token, sure, taps, next_launch_s in _plain_steps(target, staged, rule.keep_plain, sampling):
                pending.append(taps)
                now = time.perf_counter()
                committed, staged = [staged], token
                # each step is charged its own launch, not the next one's (launched before it is read;
                # where evaluation is synchronous, a CPU, that launch is the next step's compute)
                step_ms = (now - t_step - next_launch_s + own_launch_s) * 1e3
                own_launch_s = next_launch_s
                cycle = plain_step_fields(committed, token, sure, decision, step_ms, now - t0)
                yield record(**cycle)
                t_step = time.perf_counter()  # the consumer's time is not the step's
                if stop is not None:
                    break
            if plain_threads and threads:
                backend.set_blas_threads(threads)
            ctx.extend([mx.concatenate(hs, axis=1) for hs in zip(*pending)])
            continue

        # draft: one forward over [staged, MASK x (B-1)] proposes B-1 tokens
        if alone is None:
            if draft_fn is None:
                block = target.embed(mx.array([staged] + [mask_id] * (B - 1)))[None]
                logits = head.logits(draft.propose(block, ctx.kv, ctx.length)[:, 1:])[0]  # over the head's rows
                if sampling:
                    q = sampling.probabilities(logits)
                    rows = mx.random.categorical(mx.log(q))
                    sure = mx.take_along_axis(q, rows[:, None], axis=-1)[:, 0]
                    q = head.spread(q)
                else:
                    rows, q = mx.argmax(logits, axis=-1), None
                    sure = mx.exp(mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1))
                proposals = head.token_ids(rows)
            else:
                drafted, q = draft_fn(prompt_ids + tokens + [staged], B), None
                proposals, sure = mx.array(drafted), mx.ones(len(drafted))  # a deterministic draft is sure
            if rule.reads_confidence:  # where a verified row costs time (a CPU), read the draft's confidence first
                mx.eval(proposals, sure)
                confidence = sure.tolist()
                decision = rule.after_draft(confidence)
                if copied:  # the draft's block tempers the copy's chances
                    p_copied = copies.p_tokens(copied, proposals.tolist(), rule.acceptance.p(confidence))
            else:  # where rows are cheap (a GPU), decide without it: the cycle then syncs with the host once
                decision = rule.after_draft(None)
            instead = rule.copy_instead(p_copied, copies.reason(copied), decision) if copied else None
            decision, copied = (instead, copied) if instead else (decision, None)
        if copied:  # the copy is verified instead: a deterministic draft, as sure of each token as expected
            copied = copied.first(decision.verified)
            proposals, q = mx.array(copied.tokens), None
            sure = mx.array(p_copied[: decision.verified])
        # the last cycle verifies no more proposals than the budget has room for after the staged token
        verified = min(decision.verified, max_tokens - len(tokens) - 1)
        t_draft = time.perf_counter()

        # verify: one target forward over [staged, d0 .. d(verified-1)]
        # no empty array where none is verified (one, in a scan, crashed MLX's CUDA backend)
        fed = mx.concatenate([mx.array([staged]), proposals[:verified]]) if verified else mx.array([staged])
        logits, taps = target.verify(fed)
        posterior = mx.argmax(logits, axis=-1)  # the target's greedy choices
        mx.eval(proposals, sure, posterior)
        drafted, confidence, posterior = proposals.tolist(), sure.tolist(), posterior.tolist()
        t_verify = time.perf_counter()

        # accept + commit: staged plus the accepted prefix; the target's next token is staged
        committed = [staged]
        if sampling is None:  # greedy: the prefix that agrees with the target's choices
            a, draws = accepted_length(drafted[:verified], posterior), None
            staged = posterior[a]
        else:  # the next token: a residual resample after a rejection, else drawn from p
            q = point_mass(drafted, logits.shape[-1]) if q is None else q
            a, staged, draws = speculative_accept(drafted[:verified], q, sampling.probabilities(logits))
        committed += drafted[:a]

        # rollback: the target keeps exactly the committed tokens; the draft's context grows
        # by their hidden states only
        target.rollback(kept=a + 1, fed=verified + 1)  # computed with the next cycle's graph
        ctx.extend([h[:, : a + 1] for h in taps])
        t_rollback = time.perf_counter()

        yield record(
            staged_token=committed[0],
            drafted=drafted,
            confidence=confidence,
            verified=verified,
            posterior=posterior,
            accepted_len=a,
            committed=committed,
            next_staged=staged,
            kv_trimmed=verified - a,
            gdn_replayed=a + 1 if target.hybrid and a < verified else 0,
            draft_ms=(t_draft - t) * 1e3,
            verify_ms=(t_verify - t_draft) * 1e3,
            rollback_ms=(t_rollback - t_verify) * 1e3,
            t=t_rollback - t0,
            decision=decision,
            draws=draws,
            copied_from=copied.start if copied else None,
            copy_match=copied.match if copied else 0,
        )
    rule.costs.carry()
    if prefix_cache is not None:
        prefix_cache.store(target, ctx, prompt_ids + tokens)
    yield RunSummary(
        engine="dflash",
        prompt_tokens=len(prompt_ids),
        cached_prompt_tokens=reused,
        tokens=tokens,
        prefill_s=t0 - t_start,
        decode_s=time.perf_counter() - t0,
        stop_reason=stop,
        peak_memory_mb=mx.get_peak_memory() / 2**20,
        block_size=B,
        min_confidence=0.0 if rule.adaptive else min_confidence,
        cycles=tally.cycles,
        drafted_tokens=tally.drafted_tokens,
        accepted_tokens=tally.accepted_tokens,
        accepted_per_position=tally.accepted_per_position,
        sampling=sampling,
        policy=rule.name,
        plain_steps=tally.plain_steps,
        verified_rows=tally.verified_rows,
        cycle_s=tally.cycle_s,
        acceptance_by_confidence=tally.by_confidence,
        copy=copy,
        copied_cycles=tally.copied_cycles,
        copied_committed=tally.copied_committed,
        copied_verified=tally.copied_verified,
        copied_accepted=tally.copied_accepted,
        pipelined=pipelined,
        compiled=compiled,
    )


def _plain_steps(target: Target, staged: int, keep_going: Callable[[], bool], sampling: Sampling | None):
    """Plain target steps from `staged`: yields (next token, the target's probability of it, its
    input's taps, the seconds the following step's launch took) per step. Each step is launched
    before the previous one's token is read, as mlx-lm's generate_step does, so that building one
    step's graph overlaps computing the last; `keep_going()`, asked before each launch, has
    therefore seen all but the step in flight."""

    def launch(token: mx.array):
        logits, taps = target.step(token)
        if sampling:
            probs = sampling.probabilities(logits[None])
            nxt = mx.random.categorical(mx.log(probs))
            sure = probs[0, nxt[0]]
        else:
            nxt = mx.argmax(logits, axis=-1, keepdims=True)
            sure = mx.exp(mx.max(logits) - mx.logsumexp(logits))
        mx.async_eval(nxt, sure, *taps)
        return nxt, sure, taps

    step = launch(mx.array([staged]))
    while True:
        token, sure, taps = step
        more, t = keep_going(), time.perf_counter()
        if more:
            step = launch(token)
        launch_s = time.perf_counter() - t
        yield token.item(), sure.item(), taps, launch_s
        if not more:
            return


def baseline_generate(
    model,
    prompt_ids: list,
    *,
    max_tokens: int,
    eos_ids: set,
    should_stop: Callable[[], bool] = lambda: False,
    sampling: Sampling | None = None,
    prompt_cache: list | None = None,
) -> Iterator:
    """Plain decoding through mlx-lm's own generate_step: greedy (the baseline) unless `sampling`
    is given (plain sampling, from the distribution DFlash's sampling also draws from). Yields
    TokenEvents, then a RunSummary. `prompt_cache`: mlx-lm caches that already hold the start of
    the prompt (not all of it), from which only the rest is fed."""
    mx.reset_peak_memory()
    tokens, stop = [], "max_tokens"
    if sampling:
        sampling.seed_draws()
    sampler = sampling.sampler() if sampling else (lambda logprobs: mx.argmax(logprobs, axis=-1))
    t_start = time.perf_counter()
    t0 = None
    cached_tokens = 0 if prompt_cache is None else held_length(prompt_cache)
    fed = mx.array(prompt_ids[cached_tokens:])
    for tok, _ in generate_step(fed, model, max_tokens=max_tokens, sampler=sampler, prompt_cache=prompt_cache):
        t = time.perf_counter()
        t0 = t0 or t
        tokens.append(tok)
        yield TokenEvent(index=len(tokens) - 1, token=tok, t=t - t0)
        if tok in eos_ids:
            stop = "eos"
            break
        if should_stop():
            stop = "cancelled"
            break
    t_end = time.perf_counter()
    # generate_step has already started the step after the last token: let it finish, so that the
    # next run starts with nothing in flight (a sharded target's all-reduces from two runs at once
    # would pair different tensors on different processes)
    mx.synchronize(generation_stream)
    t0 = t0 or t_end
    yield RunSummary(
        engine="baseline" if sampling is None else "sampling",
        prompt_tokens=len(prompt_ids),
        cached_prompt_tokens=cached_tokens,
        tokens=tokens,
        prefill_s=t0 - t_start,
        decode_s=t_end - t0,
        stop_reason=stop,
        peak_memory_mb=mx.get_peak_memory() / 2**20,
        sampling=sampling,
    )


class OracleDraft:
    """A draft that proposes the target's own greedy continuation (from a baseline run): every
    block is fully accepted, so a run shows the machinery's ceiling. Called with the context's
    tokens (a `draft_fn`); `on_device` proposes the same in a pipelined cycle."""

    def __init__(self, prompt_len: int, reference: list, filler: int = 0):
        self.prompt_len, self.reference, self.filler = prompt_len, reference, filler

    def __call__(self, context: list, block_size: int) -> list:
        start = len(context) - self.prompt_len  # index of the token after the staged one
        ahead = self.reference[start : start + block_size - 1]
        return ahead + [self.filler] * (block_size - 1 - len(ahead))

    def by_position(self, size: int) -> mx.array:
        """(size,): the reference's token at each position of the context (prompt + reply), filler
        elsewhere, so that a pipelined cycle looks its proposals up by the cache's length alone
        (one graph serves every request of a size: nothing of this one is in it)."""
        tokens = [self.filler] * self.prompt_len + self.reference
        return mx.array((tokens + [self.filler] * size)[:size], dtype=mx.int32)

    @staticmethod
    def on_device(held: mx.array, n: int, by_position: mx.array) -> mx.array:
        """The n tokens after the staged one, where the target's cache holds `held` positions (an
        array: the prompt and the committed tokens; the staged one is not fed yet); past the
        table, filler (a cycle launched ahead of the end)."""
        at = held + 1 + mx.arange(n)
        return mx.take(by_position, mx.minimum(at, by_position.shape[0] - 1))


def first_divergence(model, prompt_ids: list, ours: list, reference: list) -> Divergence | None:
    """Where two generations first differ, with the target's top-2 logit margin there (a tiny
    margin means float noise between batched and one-token forwards, not a wrong token)."""
    n = next((i for i, (x, y) in enumerate(zip(ours, reference)) if x != y), None)
    if n is None:
        if len(ours) == len(reference):
            return None
        n = min(len(ours), len(reference))
    logits = model(mx.array(prompt_ids + reference[:n])[None])[0, -1]
    top2 = mx.sort(logits)[-2:].tolist()
    return Divergence(
        index=n,
        dflash_token=ours[n] if n < len(ours) else None,
        baseline_token=reference[n] if n < len(reference) else None,
        top2_margin=top2[1] - top2[0],
    )
