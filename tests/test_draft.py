"""The draft's forward: sliding-window layers mask exactly where the window is exceeded."""

import mlx.core as mx
import pytest

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core import draft as draft_module
from dflash_core.draft import DraftConfig, DraftContext, DraftModel

WINDOW, BLOCK = 8, 4


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
    cfg = DraftConfig(
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=50,
        target_layer_ids=[0],
        mask_token_id=1,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=WINDOW,
    )
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
