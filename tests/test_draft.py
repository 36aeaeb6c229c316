"""The draft's forward (sliding-window layers mask exactly where the window is exceeded) and its
config.json in the public format."""

import mlx.core as mx
import pytest

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.engine import draft as draft_module
from dflash_core.engine.draft import DraftConfig, DraftContext, DraftModel

WINDOW, BLOCK = 8, 4


def _config(**kw) -> DraftConfig:
    return DraftConfig(
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=50,
        target_layer_ids=[0],
        mask_token_id=1,
        **kw,
    )


def _always_masked(layer, offset, block_len, ctx_k):
    """The window as a mask at every offset: query p sees keys k with p - k < window."""
    window = layer.self_attn.sliding_window
    if window is None or ctx_k is None:
        return None
    q_pos = offset + mx.arange(block_len)[:, None]
    k_pos = mx.concatenate([mx.arange(ctx_k.shape[2]), offset + mx.arange(block_len)])[None]
    return (q_pos - k_pos) < window


@pytest.mark.parametrize("context", range(2, 13))
def test_sliding_window_layers_mask_once_context_and_block_exceed_the_window(context, monkeypatch):
    cfg = _config(layer_types=["sliding_attention", "full_attention"], sliding_window=WINDOW)
    mx.random.seed(0)
    model = DraftModel(cfg)
    ctx = DraftContext(model)
    ctx.extend([mx.random.normal((1, context, 32))])
    block = mx.random.normal((1, BLOCK, 32))
    ours = model(block, ctx.kv, ctx.length)
    monkeypatch.setattr(draft_module, "_window_mask", _always_masked)
    reference = model(block, ctx.kv, ctx.length)
    assert mx.allclose(ours, reference, atol=1e-5).item(), context
    if context + BLOCK > WINDOW:  # the window bites: the unmasked forward would differ
        monkeypatch.setattr(draft_module, "_window_mask", lambda *a: None)
        assert not mx.allclose(model(block, ctx.kv, ctx.length), reference, atol=1e-5).item()


@pytest.mark.parametrize("sliding", [False, True])
def test_the_exported_config_carries_the_public_keys_and_reads_back(sliding):
    """What other runtimes read from a public draft's config.json: no tied embeddings (a draft has
    none), whether any layer slides, whether the attention projections have biases."""
    types = ["sliding_attention", "full_attention"] if sliding else []
    cfg = _config(layer_types=types, sliding_window=WINDOW if sliding else None)
    d = cfg.to_dict()
    assert d["tie_word_embeddings"] is False and d["attention_bias"] is False
    assert d["use_sliding_window"] is sliding
    assert DraftConfig.from_dict(d) == cfg


def test_attention_bias_is_read_from_the_config():
    d = _config().to_dict()
    biased = DraftModel(DraftConfig.from_dict({**d, "attention_bias": True}))
    plain = DraftModel(DraftConfig.from_dict(d))
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert "bias" in biased.layers[0].self_attn[name] and "bias" not in plain.layers[0].self_attn[name]


@pytest.mark.parametrize(
    "rope_scaling", [None, {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}]
)
def test_the_compiled_forward_equals_the_models_own_as_the_context_grows(monkeypatch, rope_scaling):
    """DFLASH_COMPILE_DRAFT=1: each layer's work around its attention compiled, the offset an
    array. Over growing contexts (one compiled shape, offsets that change) and a sliding window,
    its block hidden states are the model's own."""
    cfg = _config(layer_types=["sliding_attention", "full_attention"], sliding_window=WINDOW, rope_scaling=rope_scaling)
    mx.random.seed(1)
    model = DraftModel(cfg)
    ctx = DraftContext(model)
    block = mx.random.normal((1, BLOCK, 32))
    monkeypatch.setenv(draft_module.COMPILE_ENV, "1")
    for rows in (3, 1, 4, 2, 5):
        ctx.extend([mx.random.normal((1, rows, 32))])
        eager = model(block, ctx.kv, ctx.length)
        compiled = model.propose(block, ctx.kv, ctx.length)
        assert mx.allclose(compiled, eager, atol=1e-5).item(), ctx.length
    assert len(model.__dict__["_compiled"]) == 2 and "_compiled" not in model  # not a parameter
    monkeypatch.setenv(draft_module.COMPILE_ENV, "0")
    assert mx.array_equal(model.propose(block, ctx.kv, ctx.length), model(block, ctx.kv, ctx.length)).item()


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_the_engine_with_the_compiled_draft_is_lossless(random_pairs, family, monkeypatch):
    monkeypatch.setenv(draft_module.COMPILE_ENV, "1")
    pair = random_pairs[family]
    ids = pair.encode("def parse(line):\n    return line.split()\n", chat_template=False)
    *_, base = pair.baseline(ids, 40)
    *cycles, ours = pair.dflash(ids, 40, policy="fixed", min_confidence=0.0)
    assert ours.tokens == base.tokens and len(cycles) > 1
    assert "_compiled" in pair.draft.__dict__  # the run went through the compiled path
