"""Lossless: DFlash emits exactly plain greedy decoding's tokens, whatever the draft proposes."""

import itertools
import random

import mlx.core as mx
import numpy as np
import pytest
from code_prompts import PROMPTS

from dflash_core.engine import OracleDraft, accepted_length
from dflash_core.engine.events import CycleEvent, RunSummary
from dflash_core.engine.policy import confident_prefix
from dflash_core.engine.target import Target
from dflash_core.training.random_models import FAMILIES


def run(gen):
    events = list(gen)
    assert isinstance(events[-1], RunSummary)
    return events[:-1], events[-1]


def full_verifies(cycles, block_size: int, max_tokens: int) -> bool:
    """Every drafted cycle verified the whole block, the last one as much of it as the budget left
    room for after its staged token."""
    done = 0
    for ev in cycles:
        if ev.verified != min(block_size - 1, max_tokens - done - 1):
            return False
        done += len(ev.committed)
    return True


@pytest.mark.parametrize(
    "drafted, posterior, expected",
    [
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3], [9, 2, 3, 4], 0),
        ([1, 2, 3], [1, 9, 3, 4], 1),  # a later match after a miss is never accepted
        ([5], [5, 6], 1),
        ([], [7], 0),
    ],
)
def test_accepted_length(drafted, posterior, expected):
    assert accepted_length(drafted, posterior) == expected


@pytest.mark.parametrize(
    "confidence, threshold, expected",
    [
        ([0.9, 0.8, 0.7], 0.0, 3),  # 0: all
        ([0.1, 0.9, 0.9], 0.5, 3),  # the first always goes, whatever its confidence
        ([0.9, 0.3, 0.9], 0.5, 1),  # a leading prefix: a later confident one is not sent
        ([0.9, 0.6, 0.4, 0.9], 0.5, 2),
        ([0.9, 0.9], 1.0, 1),
    ],
)
def test_confident_prefix(confidence, threshold, expected):
    assert confident_prefix(confidence, threshold) == expected


@pytest.mark.parametrize("family", FAMILIES)
# block size 2 stays in the fast subset: every family (plain KV and GatedDeltaNet caches) in seconds
@pytest.mark.parametrize(
    "block_size", [pytest.param(16, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow), 2]
)
def test_random_draft_is_lossless(random_pairs, family, block_size):
    pair = random_pairs[family]
    for prompt in PROMPTS:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 40))
        cycles, summary = run(pair.dflash(ids, 40, block_size, min_confidence=0.0))
        assert full_verifies(cycles, block_size, 40)
        assert summary.tokens == base.tokens, prompt
        assert [t for ev in cycles for t in ev.committed] == summary.tokens
        assert summary.cycles == len(cycles)


def _corrupting_draft(reference, prompt_len, vocab, rng, mode):
    """Proposals derived from the true continuation: all wrong, or right up to a position that
    cycles through 0 .. B-1 (B-1: all right), so every accepted length occurs."""
    oracle = OracleDraft(prompt_len, reference)
    calls = iter(range(1 << 30))

    def propose(context, block_size):
        good = oracle(context, block_size)
        cut = 0 if mode == "wrong" else next(calls) % block_size
        return good[:cut] + [(t + 1 + rng.randrange(vocab - 1)) % vocab for t in good[cut:]]

    return propose


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_accepted_length_is_lossless(random_pairs, family):
    """Oracle, always-wrong and partly-right drafts exercise a = 0 .. B-1 on every cache kind."""
    pair = random_pairs[family]
    vocab = pair.draft.config.vocab_size
    rng = random.Random(0)
    seen = set()
    for block_size in (8, 16):
        for prompt in PROMPTS[:2]:
            ids = pair.encode(prompt, chat_template=False)
            _, base = run(pair.baseline(ids, 150))
            drafts = {
                "oracle": OracleDraft(len(ids), base.tokens),
                "wrong": _corrupting_draft(base.tokens, len(ids), vocab, rng, "wrong"),
                "partly": _corrupting_draft(base.tokens, len(ids), vocab, rng, "partly"),
            }
            for name, draft_fn in drafts.items():
                cycles, summary = run(pair.dflash(ids, 150, block_size, draft_fn=draft_fn, policy="fixed"))
                assert summary.tokens == base.tokens, (name, block_size, prompt)
                assert full_verifies(cycles, block_size, 150)
                for ev in cycles:
                    assert ev.kv_trimmed == ev.verified - ev.accepted_len
                    # a whole block accepted leaves nothing to undo: no replay then
                    replays = pair.target.hybrid and ev.accepted_len < ev.verified
                    assert ev.gdn_replayed == (ev.accepted_len + 1 if replays else 0)
                    assert len(ev.posterior) == ev.verified + 1 and len(ev.drafted) == block_size - 1
                if name == "oracle":
                    full = [ev.accepted_len for ev in cycles[:-1]]
                    assert full and all(a == block_size - 1 for a in full)
                if name == "wrong":
                    assert all(ev.accepted_len == 0 for ev in cycles)
                if block_size == 16:
                    seen |= {ev.accepted_len for ev in cycles}
    assert seen == set(range(16))


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_run_ending_on_the_staged_token_takes_no_cycle_for_it(random_pairs, family):
    """With an oracle draft every cycle commits B tokens and stages the next. A budget of k * B + 1,
    or an EOS as token k * B + 1, ends the run on the k-th cycle's staged token: it is emitted with
    that cycle (k cycles, not k + 1). A budget of k * B + 4 verifies only the 3 proposals that fit
    after the last cycle's staged token."""
    from dflash_core.engine import baseline_generate, dflash_generate

    pair, B, k = random_pairs[family], 8, 3
    ids = pair.encode(PROMPTS[1], chat_template=False)
    _, free = run(pair.baseline(ids, 6 * B))
    oracle = OracleDraft(len(ids), free.tokens)
    for (budget, last_verified, last_committed), piped in itertools.product(
        ((k * B + 1, B - 1, B + 1), (k * B + 4, 3, 4)), (False, True)
    ):
        cycles, ours = run(
            pair.dflash(ids, budget, B, draft_fn=oracle, policy="fixed", min_confidence=0.0, pipelined=piped)
        )
        assert ours.pipelined == (piped and not pair.target.hybrid)
        assert ours.tokens == free.tokens[:budget] and ours.stop_reason == "max_tokens"
        assert ours.cycles == len(cycles) == k + (budget > k * B + 1)
        assert cycles[-1].verified == last_verified and len(cycles[-1].committed) == last_committed
    # an EOS first met as a cycle's staged token: the run stops on it, not before
    k = next(j for j in range(1, 6) if free.tokens[j * B] not in free.tokens[: j * B])
    eos = free.tokens[k * B]
    _, base = run(baseline_generate(pair.model, ids, max_tokens=100, eos_ids={eos}))
    cycles, ours = run(
        dflash_generate(
            pair.target, pair.draft, ids, max_tokens=100, block_size=B, eos_ids={eos}, draft_fn=oracle, policy="fixed"
        )
    )
    assert ours.tokens == base.tokens == free.tokens[: k * B + 1] and ours.stop_reason == "eos"
    assert ours.cycles == k


@pytest.mark.parametrize("family", FAMILIES)
def test_stops_at_eos_like_baseline(random_pairs, family):
    pair = random_pairs[family]
    ids = pair.encode(PROMPTS[0], chat_template=False)
    _, free = run(pair.baseline(ids, 30))
    eos = {free.tokens[12]}
    from dflash_core.engine import baseline_generate, dflash_generate

    _, base = run(baseline_generate(pair.model, ids, max_tokens=30, eos_ids=eos))
    _, ours = run(dflash_generate(pair.target, pair.draft, ids, max_tokens=30, block_size=16, eos_ids=eos))
    assert base.stop_reason == ours.stop_reason == "eos"
    assert ours.tokens == base.tokens and ours.tokens[-1] in eos


def test_summary_counts_match_cycles(random_pairs):
    pair = random_pairs["qwen3"]
    ids = pair.encode(PROMPTS[1], chat_template=False)
    _, base = run(pair.baseline(ids, 60))
    cycles, s = run(
        pair.dflash(
            ids,
            60,
            8,
            draft_fn=_corrupting_draft(base.tokens, len(ids), 500, random.Random(1), "partly"),
            policy="fixed",
        )
    )
    assert s.accepted_tokens == sum(ev.accepted_len for ev in cycles)
    assert s.drafted_tokens == sum(ev.verified for ev in cycles)
    assert full_verifies(cycles, 8, 60)
    for k in range(7):
        assert s.accepted_per_position[k] == sum(ev.accepted_len > k for ev in cycles)
    assert all(ev.draft_ms >= 0 and ev.verify_ms > 0 and ev.rollback_ms >= 0 for ev in cycles)
    assert [ev.t for ev in cycles] == sorted(ev.t for ev in cycles)


def test_cancel_stops_within_a_cycle(random_pairs):
    pair = random_pairs["llama"]
    ids = pair.encode(PROMPTS[0], chat_template=False)
    n = 0

    def stop():
        return n >= 3

    for ev in pair.dflash(ids, 200, 4, should_stop=stop):
        if isinstance(ev, CycleEvent):
            n += 1
        else:
            # asked once the 3rd cycle was seen: the cycle in flight finishes, nothing more
            assert ev.stop_reason == "cancelled" and ev.cycles == 4


@pytest.mark.parametrize("kept", [1, 3, 8])
def test_rollback_equals_running_only_the_accepted_tokens(random_pairs, kept):
    """After verify(8 tokens) + rollback(kept), every cache (GatedDeltaNet conv and recurrent state,
    attention KV) equals that of feeding only the kept tokens."""
    pair = random_pairs["qwen3_5"]
    prompt = pair.encode(PROMPTS[2], chat_template=False)
    block = [int(t) for t in np.random.default_rng(kept).integers(0, 400, size=8)]

    rolled = Target(pair.model, pair.draft.config.target_layer_ids)
    rolled.prefill(prompt)
    rolled.verify(block)
    rolled.rollback(kept=kept, fed=len(block))

    fresh = Target(pair.model, pair.draft.config.target_layer_ids)
    fresh.prefill(prompt)
    fresh.verify(block[:kept])
    mx.eval([c.state for c in rolled.cache], [c.state for c in fresh.cache])

    assert len(rolled.gdn_layers) > 0
    for a, b in zip(rolled.cache, fresh.cache):
        if hasattr(a, "offset"):  # attention: same length, same entries
            assert a.offset == b.offset == len(prompt) + kept
            np.testing.assert_allclose(
                np.array(a.keys[..., : a.offset, :]), np.array(b.keys[..., : b.offset, :]), atol=1e-5
            )
        else:
            for x, y in zip(a.cache, b.cache):
                np.testing.assert_allclose(np.array(x), np.array(y), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_quantized_target_is_lossless(random_dirs, family):
    """4-bit targets (how community MLX conversions ship) keep quantized embeddings and heads."""
    import mlx.nn as nn

    from dflash_core.models.loading import check_fit, load_pair

    pair = load_pair(*map(str, random_dirs[family]))
    nn.quantize(pair.model, group_size=32, bits=4)
    check_fit(pair.model, pair.draft, len(pair.model.layers))
    pair.target = Target(pair.model, pair.draft.config.target_layer_ids)
    assert type(pair.target.inner.embed_tokens).__name__ == "QuantizedEmbedding"
    for prompt in PROMPTS[:2]:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 40))
        _, ours = run(pair.dflash(ids, 40, 8))
        assert ours.tokens == base.tokens


# --- architectures beyond random_models.FAMILIES -------------------------------------------------

WINDOW = 8  # sliding windows shorter than the prompts below: the rotating caches wrap during prefill
MORE_ARCHITECTURES = {
    "llama-sliding": {
        "model_type": "llama",
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "sliding_window": WINDOW,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 16,
    },
    # gemma-4-26B-A4B-it, as its checkpoint is laid out: the multimodal wrapper around gemma4_text,
    # a MoE block beside each layer's MLP; here also KV-shared layers (Gemma 4's small models),
    # which keep no cache of their own
    "gemma4": {
        "model_type": "gemma4",
        "text_config": {
            "model_type": "gemma4_text",
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention"] * 3,
            "num_hidden_layers": 6,
            "num_kv_shared_layers": 2,
            "hidden_size_per_layer_input": 0,
            "global_head_dim": 32,
            "enable_moe_block": True,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
        },
    },
    "qwen3_5_moe": {
        "model_type": "qwen3_5_moe",
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "rope_parameters": {"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    },
}
# caches DFlash cannot roll back: Mamba / Mamba-2 / short-convolution layers, alone or beside attention
UNSUPPORTED = {
    "mamba": {
        "model_type": "mamba",
        "state_size": 8,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": 4,
    },
    "nemotron_h": {
        "model_type": "nemotron_h",
        "attention_bias": False,
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 8,
        "conv_kernel": 4,
        "n_groups": 1,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
        "hybrid_override_pattern": "M*M*",
    },
    "jamba": {
        "model_type": "jamba",
        "attn_layer_offset": 1,
        "attn_layer_period": 2,
        "expert_layer_offset": 1,
        "expert_layer_period": 2,
        "mamba_d_conv": 4,
        "mamba_d_state": 8,
        "mamba_expand": 2,
        "num_experts": 2,
        "num_experts_per_tok": 1,
    },
    "lfm2": {
        "model_type": "lfm2",
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "full_attn_idxs": [1, 3],
    },
}


def write_architecture(root, name: str, config: dict, seed: int = 5):
    """(target dir, draft dir): a random llama-shaped target directory (tokenizer, sizes) with
    `config` laid over its config.json and fresh random weights of that architecture, and a draft."""
    import json

    from mlx.utils import tree_flatten

    from dflash_core.training.random_models import write_draft, write_target
    from dflash_core.training.train_target import build_model

    target = write_target(root / name, "llama", seed=seed)
    cfg = {**json.loads((target / "config.json").read_text()), **config}
    if "text_config" in config:  # a multimodal wrapper: the sizes go inside it too
        cfg["text_config"] = {**cfg, **config["text_config"]}
        del cfg["text_config"]["text_config"]
        cfg["num_hidden_layers"] = cfg["text_config"]["num_hidden_layers"]
    mx.random.seed(seed)
    model = build_model(cfg)
    mx.save_safetensors(str(target / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (target / "config.json").write_text(json.dumps(cfg))
    return target, write_draft(root / f"{name}-draft", target, seed=seed + 1)


@pytest.fixture(scope="module")
def architecture_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("architectures")
    made = {}

    def get(name):
        if name not in made:
            made[name] = write_architecture(root, name, {**MORE_ARCHITECTURES, **UNSUPPORTED}[name])
        return made[name]

    return get


def test_every_supported_architecture_is_tested():
    from dflash_core.engine.target import SUPPORTED_ARCHITECTURES

    tested = set(FAMILIES) | {"llama" if name == "llama-sliding" else name for name in MORE_ARCHITECTURES}
    assert {"gpt_oss", "qwen3_moe", "qwen3_next", "gemma4_text"} <= set(FAMILIES)
    assert set(SUPPORTED_ARCHITECTURES) == tested


def _lossless_for_every_accepted_length(pair, prompts, max_tokens=60):
    """The draft model's and the oracle / wrong / partly-right proposals give plain greedy's tokens."""
    rng, vocab = random.Random(0), pair.draft.config.vocab_size
    for ids in prompts:
        _, base = run(pair.baseline(ids, max_tokens))
        for block_size in (16, 4):
            drafts = {
                "draft model": None,
                "oracle": OracleDraft(len(ids), base.tokens),
                "wrong": _corrupting_draft(base.tokens, len(ids), vocab, rng, "wrong"),
                "partly": _corrupting_draft(base.tokens, len(ids), vocab, rng, "partly"),
            }
            for name, draft_fn in drafts.items():
                _, ours = run(pair.dflash(ids, max_tokens, block_size, draft_fn=draft_fn, min_confidence=0.0))
                assert ours.tokens == base.tokens, (name, block_size)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-sliding", "gemma3_text", "gemma4"])
def test_sliding_window_target_is_lossless(architecture_dirs, name):
    """Sliding-window layers keep a RotatingKVCache of WINDOW entries; the prompts are longer, so
    the cache has wrapped before the first cycle, and rollback trims a wrapped cache."""
    from mlx_lm.models.cache import RotatingKVCache

    from dflash_core.models.loading import load_pair

    pair = load_pair(*map(str, architecture_dirs(name)))
    prompts = [pair.encode(p, chat_template=False) for p in PROMPTS[1:3]]
    assert all(len(ids) > WINDOW for ids in prompts)
    _lossless_for_every_accepted_length(pair, prompts)
    windows = [c for c in pair.target.cache if isinstance(c, RotatingKVCache)]
    assert windows and all(c.max_size == WINDOW and c.offset > 2 * WINDOW for c in windows)


@pytest.mark.slow
def test_qwen3_5_moe_target_is_lossless(architecture_dirs):
    from dflash_core.models.loading import load_pair

    pair = load_pair(*map(str, architecture_dirs("qwen3_5_moe")))
    assert pair.target.hybrid
    _lossless_for_every_accepted_length(pair, [pair.encode(PROMPTS[1], chat_template=False)])


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_architecture_is_one_clear_error(architecture_dirs, name):
    from dflash_core.errors import DFlashError
    from dflash_core.models.loading import load_pair

    with pytest.raises(DFlashError) as e:
        load_pair(*map(str, architecture_dirs(name)))
    assert f"architecture '{name}' is not supported" in str(e.value)
    assert "qwen3_5" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["gemma3_text", "gemma4_text", "gemma4", "qwen3"])
def test_the_block_is_embedded_as_the_target_embeds_its_own_input(random_pairs, architecture_dirs, name, monkeypatch):
    """Gemma scales its input embeddings by sqrt(hidden) inside its forward: Target.embed (the
    draft's block) gives exactly what the first decoder layer receives, scaled where the family
    scales."""
    from dflash_core.models.loading import load_pair

    target = random_pairs[name].target if name in random_pairs else load_pair(*map(str, architecture_dirs(name))).target
    received = []
    first = target.layers[0]

    class Recording(type(first)):
        def __call__(self, x, *args, **kwargs):
            received.append(x)
            return super().__call__(x, *args, **kwargs)

    monkeypatch.setattr(first, "__class__", Recording)
    ids = mx.array([[3, 1, 4, 1, 5]])
    target.inner(ids)
    assert mx.array_equal(target.embed(ids), received[0]).item()
    scaled = not mx.array_equal(target.embed(ids), target.inner.embed_tokens(ids)).item()
    assert scaled == name.startswith("gemma")


# --- the draft's vocabulary (Target.draft_head) --------------------------------------------------


@pytest.mark.parametrize("bits", [None, 4])
def test_draft_head_computes_only_the_vocabulary_rows(random_dirs, bits):
    """Plain and quantized tied heads: the rows' logits are the full head's at those tokens, a row
    maps back to its token, spread probabilities sit on the right tokens; made once per vocabulary."""
    import mlx.nn as nn

    from dflash_core.models.loading import load_pair

    pair = load_pair(*map(str, random_dirs["qwen3"]))
    if bits:
        nn.quantize(pair.model, group_size=32, bits=bits)
    target = Target(pair.model, pair.draft.config.target_layer_ids)
    h = mx.random.normal((1, 5, pair.draft.config.hidden_size), key=mx.random.key(0))
    vocab = (17, 3, 250, 41)
    head = target.draft_head(vocab)
    assert target.draft_head(vocab) is head and target.draft_head(None).logits is target.head
    full, ours = np.array(target.head(h)), np.array(head.logits(h))
    np.testing.assert_allclose(ours, full[..., list(vocab)], rtol=1e-5, atol=1e-5)
    assert head.token_ids(mx.array([2, 0])).tolist() == [250, 17]
    spread = np.array(head.spread(mx.array([[0.1, 0.2, 0.3, 0.4]])))
    assert spread.shape == (1, full.shape[-1]) and spread[0, 41] == np.float32(0.4) and spread.sum() == np.float32(1.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_draft_vocabulary_proposes_only_its_tokens_and_stays_lossless(random_pairs, family, monkeypatch):
    """On a CPU the draft proposes from its vocabulary; where it does not pay (a GPU) from all."""
    from dataclasses import replace

    from dflash_core import backend

    pair = random_pairs[family]
    vocab = tuple(range(0, pair.draft.config.vocab_size, 3))
    monkeypatch.setattr(pair.draft, "config", replace(pair.draft.config, draft_vocab=vocab))
    monkeypatch.setattr(backend, "draft_vocab_pays", lambda: True)  # a CPU's choice, on any device
    assert pair.draft_vocab == vocab
    for prompt in PROMPTS[:2]:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 40))
        cycles, ours = run(pair.dflash(ids, 40, 8, min_confidence=0.0))
        assert ours.tokens == base.tokens, prompt
        assert {t for ev in cycles for t in ev.drafted} <= set(vocab)
    monkeypatch.setattr(backend, "draft_vocab_pays", lambda: False)
    assert pair.draft_vocab is None
    cycles, _ = run(pair.dflash(ids, 40, 8, min_confidence=0.0))
    assert {t for ev in cycles for t in ev.drafted} - set(vocab)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_gpu_cycle_is_lossless_anywhere(random_pairs, family, monkeypatch):
    """A GPU's synchronous cycle (tests/test_pipeline.py has the pipelined one): the verify's size
    decided without reading the draft's confidences, so the cycle syncs with the host once. Run
    here on whatever device there is."""
    from dflash_core import backend

    pair = random_pairs[family]
    monkeypatch.setattr(backend, "on_cpu", lambda: False)
    for prompt in PROMPTS[:2]:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 40))
        cycles, ours = run(pair.dflash(ids, 40, 6, min_confidence=0.0, policy="fixed", pipelined=False))
        assert ours.tokens == base.tokens, prompt
        assert full_verifies(cycles, 6, 40)
