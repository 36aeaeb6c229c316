"""The prefix cache: a run that resumes from a snapshot gives exactly a cold run's tokens, on
every cache kind (attention, sliding window, GatedDeltaNet), greedy and seeded sampling; caches
that cannot be cut back are used only at the boundaries stored; snapshots are copies; the LRU
keeps to its bytes."""

import mlx.core as mx
import numpy as np
import pytest
from code_prompts import PROMPTS
from mlx_lm.models.cache import KVCache
from test_engine import MORE_ARCHITECTURES, write_architecture

from dflash_core.engine import OracleDraft, dflash_generate
from dflash_core.engine.draft import DraftContext
from dflash_core.engine.prefix_cache import PrefixCache, prefill
from dflash_core.engine.sampling import Sampling
from dflash_core.engine.target import PREFILL_CHUNK
from dflash_core.models.loading import load_pair

SAMPLING = Sampling(temperature=0.9, top_p=0.95, seed=7)


@pytest.fixture(scope="module")
def pairs(random_pairs, tmp_path_factory):
    """family -> Pair: the random families and a llama with sliding-window layers."""
    sliding = write_architecture(
        tmp_path_factory.mktemp("sliding"), "llama-sliding", MORE_ARCHITECTURES["llama-sliding"]
    )
    return {**random_pairs, "llama-sliding": load_pair(*map(str, sliding))}


def run(pair, ids, max_tokens, cache=None, **kw):
    pair.prefix_cache = cache
    try:
        *_, summary = pair.dflash(ids, max_tokens, policy="fixed", **kw)
    finally:
        pair.prefix_cache = None
    return summary


def held(pair) -> int:
    """Tokens the target's caches hold after a run."""
    return next(c.offset for c in pair.target.cache if hasattr(c, "offset"))


@pytest.mark.parametrize("sampling", [None, SAMPLING], ids=["greedy", "seeded"])
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "llama", "llama-sliding"])
def test_a_resumed_run_gives_a_cold_runs_tokens(pairs, family, sampling):
    pair = pairs[family]
    cache = PrefixCache(64 << 20)
    first = pair.encode(PROMPTS[1], chat_template=False)
    turn = run(pair, first, 24, cache, sampling=sampling)
    cuttable = all(type(c) is KVCache for c in pair.target.cache)
    assert turn.cached_prompt_tokens == 0 and cache.misses == 1
    reply = turn.tokens
    # the target may hold a little less than prompt + reply (a last token emitted, not fed) or
    # more (tokens past an EOS); a cache that cannot be cut back is snapshot only in the first case
    kept = held(pair)
    whole = len(first) + len(reply)
    resumed = min(kept, whole) if cuttable or kept <= whole else len(first)
    more = pair.encode(" return x\n", chat_template=False)
    prompts = {
        "next turn": (first + reply + more, resumed),
        # the cached prefix ends inside what was the reply: only attention caches are cut back to it
        "inside the reply": (first + reply[:9] + more, len(first) + 9 if cuttable else len(first)),
        "the same prompt": (first, len(first)),  # its logits were kept: nothing is fed
    }
    for name, (ids, reused) in prompts.items():
        cold = run(pair, ids, 24, sampling=sampling)
        warm = run(pair, ids, 24, cache, sampling=sampling)
        assert warm.tokens == cold.tokens, name
        assert warm.cached_prompt_tokens == reused, name
    assert cache.hits == 3 and cache.reused_tokens == sum(n for _, n in prompts.values())


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_run_ended_by_an_eos_inside_its_last_block_is_snapshot_only_where_it_can_be_cut(pairs, family):
    """An oracle draft's first cycle commits a whole block; an EOS as its fourth token ends the
    run there. The attention target's snapshot is cut back to prompt + 4; the GatedDeltaNet state
    (all 16 fed) is not snapshot then: only the prompt's snapshot remains."""
    pair = pairs[family]
    ids = pair.encode(PROMPTS[0], chat_template=False)
    *_, base = pair.baseline(ids, 20)
    cache = PrefixCache(64 << 20)
    *_, summary = dflash_generate(
        pair.target,
        pair.draft,
        ids,
        max_tokens=20,
        block_size=16,
        eos_ids={base.tokens[3]},
        draft_fn=OracleDraft(len(ids), base.tokens),
        policy="fixed",
        prefix_cache=cache,
    )
    assert summary.tokens == base.tokens[:4] and held(pair) == len(ids) + 16
    lengths = sorted(len(k) for k in cache.keys())
    assert lengths == ([len(ids), len(ids) + 4] if family == "qwen3" else [len(ids)])


def test_a_snapshot_is_a_copy_that_later_runs_do_not_change(pairs):
    pair = pairs["qwen3"]
    cache = PrefixCache(64 << 20)
    ids = pair.encode(PROMPTS[2], chat_template=False)
    run(pair, ids, 8, cache)
    (snap,) = [s for s in cache._snapshots.values() if len(s.tokens) == len(ids)]
    before = [np.array(state[0]) for _, state in snap.target] + [np.array(k) for k, _ in snap.draft]
    # resuming from it writes the next tokens into the restored caches' buffers, in place
    run(pair, ids + [5, 6, 7], 40, cache)
    run(pair, ids, 40, cache)
    after = [np.array(state[0]) for _, state in snap.target] + [np.array(k) for k, _ in snap.draft]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_the_cache_keeps_to_its_bytes_least_recently_used_out_first(pairs):
    pair = pairs["qwen3"]
    ids = pair.encode(PROMPTS[0], chat_template=False)
    a, b, c = ([first] + ids[1:] for first in (ids[0], ids[0] + 1, ids[0] + 2))  # alike in size, no prefix shared
    probe = PrefixCache(64 << 20)
    run(pair, a, 1, probe)  # two snapshots: the prompt, and the prompt + 1 token
    cache = PrefixCache(int(2.2 * probe.nbytes))  # room for two runs' snapshots, not for a third's
    for prompt in (a, b, a, c):
        run(pair, prompt, 1, cache)
    assert cache.evictions == 2 and cache.nbytes <= cache.max_bytes
    assert {k[0] for k in cache.keys()} == {a[0], c[0]}  # b's were used least recently
    assert run(pair, a, 1, cache).cached_prompt_tokens == len(a)


def test_doctor_shows_the_servers_prefix_cache(capsys):
    import json

    from dflash_core.cli import main
    from dflash_core.engine.prefix_cache import DEFAULT_PREFIX_CACHE_MB

    assert main(["doctor"]) == 0
    assert f"prefix_cache: serve keeps up to {DEFAULT_PREFIX_CACHE_MB} MB" in capsys.readouterr().out
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefix_cache_mb"] == DEFAULT_PREFIX_CACHE_MB


def test_prefill_computes_the_prompts_draft_context_chunk_by_chunk(pairs, monkeypatch):
    """The draft's context for the prompt is computed in prefill, after each chunk the target is
    fed, not left to the first cycle's evaluation, which timed it as decoding (and kept every
    chunk's taps until then)."""
    pair = pairs["qwen3"]
    n = 2 * PREFILL_CHUNK + 76
    assert n < pair.context_length
    ids = [3 + i % 97 for i in range(n)]
    ctx, lengths, evaluate = DraftContext(pair.draft), [], mx.eval

    def recording(*arrays):
        if arrays and arrays[0] is ctx.kv:
            lengths.append(ctx.length)
        return evaluate(*arrays)

    monkeypatch.setattr(mx, "eval", recording)
    prefill(pair.target, ctx, ids, None)
    assert lengths == [PREFILL_CHUNK, 2 * PREFILL_CHUNK, n - 1, n]
