"""The speculative cycle and the plain greedy baseline, both yielding plain events."""

import time
from collections.abc import Callable, Iterator

import mlx.core as mx
from mlx_lm.generate import generate_step, generation_stream

from .draft import DraftContext, DraftModel
from .events import CycleEvent, CycleTally, Divergence, RunSummary, TokenEvent
from .sampling import Sampling, point_mass, sample, speculative_accept
from .target import Target


def accepted_length(drafted: list, posterior: list) -> int:
    """sum(cumprod(drafted == posterior[:-1])): the longest agreeing prefix. A later match after
    a mismatch is never accepted."""
    a = 0
    while a < len(drafted) and drafted[a] == posterior[a]:
        a += 1
    return a


def confident_prefix(confidence: list, min_confidence: float) -> int:
    """How many leading proposals go to the target: the first always, then each while the
    draft's top-1 probability stays >= min_confidence (0 sends all)."""
    k = 1
    while k < len(confidence) and confidence[k] >= min_confidence:
        k += 1
    return k


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
    min_confidence: float = 0.0,
    sampling: Sampling | None = None,
    draft_vocab: tuple | None = None,
) -> Iterator:
    """Yields one CycleEvent per cycle, then a RunSummary. `draft_fn(ctx_tokens, B)` replaces the
    draft model's proposals (the oracle mode of the benchmark and the tests). With min_confidence
    > 0 the target verifies only the proposals the draft is sure of (see confident_prefix): where
    each verified row costs time (a CPU), rows that would likely be rejected are not worth it.
    With `sampling` the draft samples its proposals and acceptance is speculative sampling
    (sampling.speculative_accept); without, everything is greedy. With `draft_vocab` the draft
    proposes only those tokens (its DraftConfig.draft_vocab; see Target.draft_head)."""
    B, mask_id = block_size, draft.config.mask_token_id
    mx.reset_peak_memory()
    if sampling:
        sampling.seed_draws()
    ctx = DraftContext(draft)
    head = target.draft_head(draft_vocab)
    t_start = time.perf_counter()
    first = target.prefill(prompt_ids, on_taps=ctx.extend)
    staged = sample(sampling.probabilities(first)) if sampling else mx.argmax(first).item()
    t0 = time.perf_counter()
    tokens, tally = [], CycleTally(B)
    stop, cycle = None, 0
    while stop is None:
        # draft: one forward over [staged, MASK x (B-1)] proposes B-1 tokens
        t = time.perf_counter()
        verified = B - 1
        if draft_fn is None:
            block = target.embed(mx.array([staged] + [mask_id] * (B - 1)))[None]
            logits = head.logits(draft(block, ctx.kv, ctx.length)[:, 1:])[0]  # over the head's rows
            if sampling:
                q = sampling.probabilities(logits)
                proposals = head.token_ids(mx.random.categorical(mx.log(q)))
                q = head.spread(q)
            else:
                proposals = head.token_ids(mx.argmax(logits, axis=-1))
            if min_confidence > 0:  # the draft's own probability of each proposal
                top1 = mx.exp(mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1))
                mx.eval(proposals, top1)
                verified = confident_prefix(top1.tolist(), min_confidence)
            drafted = proposals.tolist()
        else:
            drafted = draft_fn(prompt_ids + tokens + [staged], B)
            q = None  # a deterministic draft: point masses, made once the vocabulary is known
        t_draft = time.perf_counter()

        # verify: one target forward over [staged, d0 .. d(verified-1)]
        logits, taps = target.verify([staged] + drafted[:verified])
        posterior = mx.argmax(logits, axis=-1).tolist()  # the target's greedy choices
        t_verify = time.perf_counter()

        # accept + commit: staged plus the accepted prefix; the target's next token is staged
        committed = [staged]
        if sampling is None:  # greedy: the prefix that agrees with the target's choices
            a, draws = accepted_length(drafted[:verified], posterior), None
            staged = posterior[a]
        else:  # the next token: a residual resample after a rejection, else drawn from p
            q = point_mass(drafted, logits.shape[-1]) if q is None else q
            a, staged, draws = speculative_accept(drafted[:verified], q[:verified], sampling.probabilities(logits))
        committed += drafted[:a]

        # rollback: the target keeps exactly the committed tokens; the draft's context grows
        # by their hidden states only
        target.rollback(kept=a + 1, fed=verified + 1)
        mx.eval(target.gdn_state())
        ctx.extend([h[:, : a + 1] for h in taps])
        t_rollback = time.perf_counter()

        n_before = len(tokens)
        stop = _finish(tokens, committed, max_tokens, eos_ids)
        if stop is None and should_stop():
            stop = "cancelled"
        event = CycleEvent(
            cycle=cycle,
            staged_token=committed[0],
            drafted=drafted,
            verified=verified,
            posterior=posterior,
            accepted_len=a,
            committed=tokens[n_before:],
            next_staged=staged,
            kv_trimmed=verified - a,
            gdn_replayed=a + 1 if target.hybrid else 0,
            draft_ms=(t_draft - t) * 1e3,
            verify_ms=(t_verify - t_draft) * 1e3,
            rollback_ms=(t_rollback - t_verify) * 1e3,
            t=t_rollback - t0,
            draws=draws,
        )
        tally.add(event)
        yield event
        cycle += 1
    yield RunSummary(
        engine="dflash",
        prompt_tokens=len(prompt_ids),
        tokens=tokens,
        prefill_s=t0 - t_start,
        decode_s=time.perf_counter() - t0,
        stop_reason=stop,
        peak_memory_mb=mx.get_peak_memory() / 2**20,
        block_size=B,
        min_confidence=min_confidence,
        cycles=tally.cycles,
        drafted_tokens=tally.drafted_tokens,
        accepted_tokens=tally.accepted_tokens,
        accepted_per_position=tally.accepted_per_position,
        sampling=sampling,
    )


def baseline_generate(
    model,
    prompt_ids: list,
    *,
    max_tokens: int,
    eos_ids: set,
    should_stop: Callable[[], bool] = lambda: False,
    sampling: Sampling | None = None,
) -> Iterator:
    """Plain decoding through mlx-lm's own generate_step: greedy (the baseline) unless `sampling`
    is given (plain sampling, from the distribution DFlash's sampling also draws from). Yields
    TokenEvents, then a RunSummary."""
    mx.reset_peak_memory()
    tokens, stop = [], "max_tokens"
    if sampling:
        sampling.seed_draws()
    sampler = sampling.sampler() if sampling else (lambda logprobs: mx.argmax(logprobs, axis=-1))
    t_start = time.perf_counter()
    t0 = None
    for tok, _ in generate_step(mx.array(prompt_ids), model, max_tokens=max_tokens, sampler=sampler):
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
        tokens=tokens,
        prefill_s=t0 - t_start,
        decode_s=t_end - t0,
        stop_reason=stop,
        peak_memory_mb=mx.get_peak_memory() / 2**20,
        sampling=sampling,
    )


def oracle_draft(prompt_len: int, reference: list, filler: int = 0) -> Callable:
    """A draft that proposes the target's own greedy continuation (from a baseline run): every
    block is fully accepted, so a run shows the machinery's ceiling."""

    def propose(context: list, block_size: int) -> list:
        start = len(context) - prompt_len  # index of the token after the staged one
        ahead = reference[start : start + block_size - 1]
        return ahead + [filler] * (block_size - 1 - len(ahead))

    return propose


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
