"""Pipelined cycles (dflash_core.engine.pipeline): acceptance, commit and rollback on the device,
each cycle launched before the last one is read. Lossless means the same tokens as plain greedy
decoding; the caches whose length lives on the device must read like trimmed ones."""

import json
import random

import mlx.core as mx
import pytest
from code_prompts import PROMPTS

import dflash_core.engine.cycle as cycle_module
from dflash_core.benchmark import run_benchmark
from dflash_core.engine import OracleDraft, accepted_length
from dflash_core.engine.fused_attention import attention, gpu_backend, reference_attention
from dflash_core.engine.pipeline import accepted_length_on_device, capacity_for
from dflash_core.engine.target import rollback_kv
from dflash_core.models.loading import load_pair
from dflash_core.models.registry import DEFAULT_PAIR
from dflash_core.training.chat_prompts import HELDOUT

PLAIN_KV = ["qwen3", "llama", "qwen3_moe"]  # families whose caches are all mlx-lm's KVCache


def run(gen):
    *events, summary = gen
    return events, summary


def test_acceptance_on_the_device_is_the_hosts():
    rng = random.Random(3)
    for _ in range(200):
        v = rng.randrange(1, 9)
        posterior = [rng.randrange(4) for _ in range(v + 1)]
        drafted = [p if rng.random() < 0.7 else rng.randrange(4) for p in posterior[:v]]
        got = accepted_length_on_device(mx.array(drafted), mx.array(posterior)).item()
        assert got == accepted_length(drafted, posterior), (drafted, posterior)


def test_a_device_length_cache_reads_like_a_trimmed_one(random_pairs):
    """Verify 6 rows and keep 2, twice, then step once: the logits equal those of mlx-lm's caches
    trimmed on the host (the rejected rows are overwritten, and masked until they are)."""
    target = random_pairs["qwen3"].target
    prompt, blocks = list(range(3, 40)), [[5, 9, 11, 2, 7, 4], [8, 1, 6, 3, 10, 12], [13]]

    def logits(on_device: bool, capacity: int = None) -> list:
        target.prefill(prompt)
        length = target.on_device(capacity) if on_device else None
        out = []
        for ids in blocks:
            logits, _ = target.verify(ids)
            out.append(logits)
            if on_device:
                length.advance(mx.array(2), len(ids))
                length.settle(len(ids) - 2)
            else:
                for c in target.cache:
                    rollback_kv(c, len(ids) - 2)
        if on_device:
            target.off_device(len(prompt) + 2 * len(blocks))
            assert all(c.offset == len(prompt) + 6 for c in target.cache)
        return out

    want = logits(False)
    for got in (logits(True), logits(True, capacity=128)):  # a fixed size: the forwards see every row
        for a, b in zip(want, got):
            assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item()


@pytest.mark.parametrize("causal", [False, True])
def test_valid_keys_read_as_the_first_ones(causal):
    """attention(valid=n) over N keys is attention over the first n (MLX's own path on the CPU;
    test_fused_attention checks the kernels on a GPU)."""
    k0 = mx.random.split(mx.random.key(7), 3)
    q = mx.random.normal((1, 4, 5, 64), key=k0[0])
    k = mx.random.normal((1, 2, 40, 64), key=k0[1])
    v = mx.random.normal((1, 2, 40, 64), key=k0[2])
    got = attention(q, k, v, 0.125, "causal" if causal else None, valid=mx.array([31], dtype=mx.int32))
    want = reference_attention(q, k[:, :, :31], v[:, :, :31], 0.125, causal)
    assert mx.allclose(got, want, atol=1e-5).item()


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe", "qwen3_5", "gemma4_text"])
def test_pipelined_cycles_are_lossless(random_pairs, family):
    """Drafted cycles and plain steps interleaved (the adaptive policy), and drafted cycles alone
    (the fixed one): plain greedy's tokens. Targets with other caches than KVCache (GatedDeltaNet,
    sliding windows) run the synchronous cycle instead."""
    pair = random_pairs[family]
    plain = drafted = 0
    for prompt in PROMPTS[:2]:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 40))
        for policy in ("fixed", "adaptive"):
            cycles, ours = run(pair.dflash(ids, 40, 6, min_confidence=0.0, policy=policy, pipelined=True))
            assert ours.tokens == base.tokens, (prompt, policy)
            assert [t for ev in cycles for t in ev.committed] == ours.tokens
            assert ours.pipelined == (family in PLAIN_KV)
            plain += ours.plain_steps
            drafted += ours.cycles - ours.plain_steps
        # the caches are mlx-lm's again, holding the prompt and the kept tokens
        assert all(type(c).__name__ != "DeviceKVCache" for c in pair.target.cache)
    assert plain and drafted


@pytest.mark.parametrize("family", PLAIN_KV)
def test_compiled_cycles_are_lossless(random_pairs, family):
    """Pipelined cycles as compiled graphs (pipeline.CompiledCycles): plain greedy's tokens, with
    plain steps (compiled too) interleaved and verifies of several sizes, over two prompts whose runs reuse the
    graphs traced by the first."""
    pair = random_pairs[family]
    pair.target.compiled_cycles.clear()
    for prompt in PROMPTS[:2]:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 40))
        for policy in ("fixed", "adaptive"):
            cycles, ours = run(
                pair.dflash(ids, 40, 6, min_confidence=0.0, policy=policy, pipelined=True, compiled=True)
            )
            assert ours.tokens == base.tokens, (prompt, policy)
            assert ours.compiled and ours.plain_steps < ours.cycles
    ((_, _, graphs),) = pair.target.compiled_cycles.values()
    assert graphs._graphs  # cycles ran as compiled graphs, not only the first one as it is
    assert "plain" in graphs._graphs  # the adaptive policy's plain steps ran in the pipeline, compiled
    # one trace per verified count and one for a plain step: the second prompt's runs (the same
    # cache size) replayed them
    assert graphs.traces == len(graphs._graphs)


def test_a_compiled_run_traces_every_graph_before_its_first_cycle(random_pairs):
    """Every graph a run may take (a plain step, each verified count) is traced before its first
    cycle is launched and timed, and not again during the run nor in a later run of the same cache
    size; the output stays plain greedy's."""
    pair = random_pairs["qwen3"]
    pair.target.compiled_cycles.clear()
    B = 5
    for prompt in PROMPTS[:2]:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 24))
        runs = pair.dflash(ids, 24, B, min_confidence=0.0, policy="fixed", pipelined=True, compiled=True)
        next(runs)  # the first cycle has been launched and read
        ((_, _, graphs),) = pair.target.compiled_cycles.values()
        assert sorted(graphs._graphs, key=str) == [*range(B), "plain"]
        traced = graphs.traces
        assert traced == B + 1
        _, ours = run(runs)
        assert ours.tokens == base.tokens and ours.compiled
        assert graphs.traces == traced  # nothing traced while the cycles ran, nor in the second run


def test_compiled_caches_have_one_size_per_bucket():
    sizes = (1, 300, 512, 513, 3000, 4096, 4097, 30000)
    assert [capacity_for(n) for n in sizes] == [512, 512, 512, 1024, 4096, 4096, 8192, 32768]


@pytest.mark.slow
def test_pipelined_cycles_on_the_shipped_pair_accept_what_the_synchronous_ones_do():
    """The trained draft: acceptance computed on the device gives each cycle the accepted length
    the host computes (the same draft, the same verify), and plain greedy's tokens."""
    pair = load_pair(DEFAULT_PAIR)
    seen = set()
    for prompt in json.loads(HELDOUT.read_text())[:3]:
        ids = pair.encode(prompt)
        _, base = run(pair.baseline(ids, 64))
        piped, ours = run(pair.dflash(ids, 64, 8, policy="fixed", min_confidence=0.0, pipelined=True))
        synced, theirs = run(pair.dflash(ids, 64, 8, policy="fixed", min_confidence=0.0, pipelined=False))
        assert ours.pipelined and not theirs.pipelined
        assert ours.tokens == theirs.tokens == base.tokens
        assert [ev.accepted_len for ev in piped] == [ev.accepted_len for ev in synced]
        assert all(ev.next_staged == ev.posterior[ev.accepted_len] for ev in piped)
        seen |= {ev.accepted_len for ev in piped}
    assert len(seen) >= 4  # rejections at several positions, not only the first


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("block_size", [4, 16])
def test_a_pipelined_oracle_accepts_every_block(random_pairs, block_size, compiled):
    """The oracle proposes from the target cache's length on the device: every block but the
    last is accepted whole, and the tokens are plain greedy's. Compiled, one graph serves every
    request (the oracle's table of proposals is the graph's input, not a constant of it)."""
    pair = random_pairs["llama"]
    pair.target.compiled_cycles.clear()
    for prompt in PROMPTS[:3]:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 60))
        oracle = OracleDraft(len(ids), base.tokens)
        cycles, ours = run(
            pair.dflash(
                ids,
                60,
                block_size,
                draft_fn=oracle,
                policy="fixed",
                min_confidence=0.0,
                pipelined=True,
                compiled=compiled,
            )
        )
        assert ours.pipelined and ours.compiled == compiled and ours.tokens == base.tokens, prompt
        assert [ev.accepted_len for ev in cycles[:-1]] == [block_size - 1] * (len(cycles) - 1)
    if compiled:
        ((_, _, graphs),) = pair.target.compiled_cycles.values()
        assert graphs.traces == len(graphs._graphs)  # the later requests replayed the first one's


def test_pipelining_is_asked_for(random_pairs, monkeypatch):
    pair = random_pairs["llama"]
    ids = pair.encode(PROMPTS[0], chat_template=False)
    monkeypatch.delenv(cycle_module.PIPELINE_ENV, raising=False)
    monkeypatch.delenv(cycle_module.COMPILE_ENV, raising=False)
    on_cuda = gpu_backend() == "cuda"  # on by default there, where it was measured faster
    assert run(pair.dflash(ids, 8, 4, policy="fixed", min_confidence=0.0))[1].pipelined == on_cuda
    monkeypatch.setenv(cycle_module.PIPELINE_ENV, "0")
    assert not run(pair.dflash(ids, 8, 4, policy="fixed", min_confidence=0.0))[1].pipelined
    monkeypatch.setenv(cycle_module.PIPELINE_ENV, "1")
    assert run(pair.dflash(ids, 8, 4, policy="fixed", min_confidence=0.0))[1].pipelined
    # a fixed threshold reads the draft's confidences before the verify: synchronous
    assert not run(pair.dflash(ids, 8, 4, policy="fixed", min_confidence=0.3))[1].pipelined


@pytest.mark.parametrize("sweep", ["pipeline_sweep", "compile_sweep"])
def test_the_benchmark_runs_the_cycles_side_by_side(random_pairs, monkeypatch, sweep):
    """--pipeline-sweep: pipelined (and on CUDA compiled) against synchronous; --compile-sweep:
    pipelined and compiled against synchronous, with the main setting synchronous here."""
    for env in (cycle_module.PIPELINE_ENV, cycle_module.COMPILE_ENV):
        monkeypatch.setenv(env, "0")
    res = run_benchmark(
        random_pairs["llama"],
        ["def fib(n):"],
        max_tokens=16,
        repeat=1,
        log=lambda *a: None,
        policy="fixed",
        min_confidence=0.0,
        **{sweep: True},
    )
    dflash = [r for r in res["runs"] if r["engine"] == "dflash"]
    compiled = sweep == "compile_sweep"
    assert sorted((r["pipeline"], r["pipelined"], r["compile"], r["compiled"]) for r in dflash) == [
        (False, False, False, False),
        (True, True, compiled, compiled),
    ]
    assert all(r["identical"] for r in dflash)
    rows = res["summary"][sweep]
    assert [row["compiled" if compiled else "pipeline"] for row in rows] == [False, True]
    assert res["summary"]["dflash_tps_median"] == rows[0]["dflash_tps_median"]  # the main one: synchronous
