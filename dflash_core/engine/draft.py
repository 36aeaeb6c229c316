"""The DFlash block-diffusion draft, in the public checkpoint format.

One forward turns `[staged, MASK x (B-1)]` into B-1 proposals. Its attention reads the target's
hidden states (context, cached across cycles) and the block itself, bidirectionally. It has no
embeddings and no LM head of its own: the target lends both.
"""

import os
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from . import fused_attention
from .device_cache import DeviceLength, on_device


@dataclass
class DraftConfig:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_layer_ids: list
    mask_token_id: int
    block_size: int = 16
    num_target_layers: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 40960
    layer_types: list = field(default_factory=list)
    sliding_window: int | None = None
    attention_bias: bool = False  # q/k/v/o projections with biases
    # the tokens the draft may propose (most frequent first), from draft_vocab.json beside
    # config.json; None: all of them (see Target.draft_head)
    draft_vocab: tuple | None = None

    @classmethod
    def from_dict(cls, cfg: dict) -> "DraftConfig":
        dflash = cfg.get("dflash_config") or {}
        rope = cfg.get("rope_parameters") or {}
        rope_scaling = cfg.get("rope_scaling")
        if rope and rope.get("rope_type", rope.get("type", "default")) != "default":
            rope_scaling = rope
        heads = cfg["num_attention_heads"]
        return cls(
            hidden_size=cfg["hidden_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            intermediate_size=cfg["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            vocab_size=cfg["vocab_size"],
            target_layer_ids=list(dflash.get("target_layer_ids", cfg.get("target_layer_ids", []))),
            mask_token_id=dflash.get("mask_token_id", cfg.get("mask_token_id")),
            block_size=cfg.get("block_size", 16),
            num_target_layers=cfg.get("num_target_layers", 0),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 1_000_000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 40960),
            layer_types=list(cfg.get("layer_types") or []),
            sliding_window=cfg.get("sliding_window"),
            attention_bias=bool(cfg.get("attention_bias", False)),
        )

    @classmethod
    def for_target(
        cls,
        target: dict,
        num_layers: int,
        mask_token_id: int,
        block_size: int = 16,
        intermediate_size: int = None,
        target_layer_ids: list = None,
    ) -> "DraftConfig":
        """A new draft shaped like the target's layers (hidden size, heads, head dim, RoPE base),
        reading the target layers the published spacing rule picks unless target_layer_ids says
        which. target: the target's text-model config (config.json, or mlx-lm's args as a dict)."""
        n_target = target["num_hidden_layers"]
        heads = target["num_attention_heads"]
        rope = target.get("rope_parameters") or {}
        return cls(
            hidden_size=target["hidden_size"],
            num_hidden_layers=num_layers,
            intermediate_size=intermediate_size or target["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=target.get("num_key_value_heads") or heads,
            head_dim=target.get("head_dim") or target["hidden_size"] // heads,
            vocab_size=target["vocab_size"],
            target_layer_ids=list(
                target_layer_ids
                or (default_target_layer_ids(n_target, num_layers) if n_target > 4 else [n_target // 2])
            ),
            mask_token_id=int(mask_token_id),
            block_size=block_size,
            num_target_layers=n_target,
            rms_norm_eps=target.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", target.get("rope_theta", 10000.0)),
            max_position_embeddings=target.get("max_position_embeddings", 4096),
        )

    def to_dict(self) -> dict:
        """The public config.json layout, readable by other DFlash ports (the keys the public
        drafts' configs carry: a draft has no embeddings of its own to tie, and says whether any
        of its layers slides)."""
        d = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "tie_word_embeddings": False,
            "use_sliding_window": "sliding_attention" in self.layer_types,
            "dflash_config": {
                "target_layer_ids": self.target_layer_ids,
                "mask_token_id": self.mask_token_id,
            },
        }
        if self.rope_scaling:
            d["rope_scaling"] = self.rope_scaling
        if self.layer_types:
            d["layer_types"] = self.layer_types
            d["sliding_window"] = self.sliding_window
        return d


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list:
    """The published spacing rule for a new draft (read ids from the checkpoint otherwise)."""
    n, N = num_draft_layers, num_target_layers
    if n == 1:
        return [N // 2]
    return [round(1 + i * (N - 4) / (n - 1)) for i in range(n)]


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig, sliding_window: int | None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.scale = cfg.head_dim**-0.5
        self.sliding_window = sliding_window
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.rope = initialize_rope(
            self.head_dim,
            base=cfg.rope_theta,
            traditional=False,
            scaling_config=cfg.rope_scaling,
            max_position_embeddings=cfg.max_position_embeddings,
        )

    def keys_values(self, x: mx.array, offset: int):
        """Per-head normed, rotated keys and values of x (context or block) at `offset`."""
        B, L, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        return self.rope(k, offset=offset), v

    def project(self, x: mx.array, offset):
        """The block's rotated queries, keys and values at `offset`."""
        B, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1)).transpose(0, 2, 1, 3)
        return (self.rope(q, offset=offset), *self.keys_values(x, offset))

    def attend(self, q, k, v, ctx_k, ctx_v, mask=None, visible=None) -> mx.array:
        """Per-head attention of the block over [context ; block]. With `visible` (the context
        holds rows past its length: DraftContext.visible) the block's keys go first, so that the
        keys that count are the first `visible`: the attention is bidirectional, order is free."""
        if visible is not None:
            k, v = mx.concatenate([k, ctx_k], axis=2), mx.concatenate([v, ctx_v], axis=2)
            return fused_attention.attention(q, k, v, self.scale, valid=visible)
        if ctx_k is not None:
            k = mx.concatenate([ctx_k, k], axis=2)
            v = mx.concatenate([ctx_v, v], axis=2)
        return fused_attention.attention(q, k, v, self.scale, mask)  # MLX's own on a CPU

    def output(self, out: mx.array) -> mx.array:
        B, _, L, _ = out.shape
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))

    def __call__(self, x, ctx_k, ctx_v, offset: int, mask=None, visible=None):
        return self.output(self.attend(*self.project(x, offset), ctx_k, ctx_v, mask, visible))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x):
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig, sliding_window: int | None):
        super().__init__()
        self.self_attn = Attention(cfg, sliding_window)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def project(self, h, offset):
        """The work before the attention: the block's queries, keys and values."""
        return self.self_attn.project(self.input_layernorm(h), offset)

    def finish(self, h, out):
        """The work after it: the attention's output projected and added, then the MLP."""
        h = h + self.self_attn.output(out)
        return h + self.mlp(self.post_attention_layernorm(h))

    def __call__(self, h, ctx_k, ctx_v, offset, mask=None, visible=None):
        return self.finish(h, self.self_attn.attend(*self.project(h, offset), ctx_k, ctx_v, mask, visible))


class DraftModel(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        n_taps = len(cfg.target_layer_ids)
        self.fc = nn.Linear(cfg.hidden_size * n_taps, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        types = cfg.layer_types or ["full_attention"] * cfg.num_hidden_layers
        self.layers = [DraftLayer(cfg, cfg.sliding_window if t == "sliding_attention" else None) for t in types]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def context_features(self, taps: list) -> mx.array:
        """Target hidden states of the tapped layers -> the draft's context features."""
        return self.hidden_norm(self.fc(mx.concatenate(taps, axis=-1)))

    def __call__(self, block_embeds: mx.array, ctx_kv: list, offset, visible=None) -> mx.array:
        """Hidden states of the block; ctx_kv holds each layer's cached context (keys, values).
        visible: where the context holds rows past its length (DraftContext.visible; full-attention
        layers only), the keys that count."""
        h = block_embeds
        for layer, (k, v) in zip(self.layers, ctx_kv):
            mask = None if visible is not None else _window_mask(layer, offset, h.shape[1], k)
            h = layer(h, k, v, offset, mask, visible)
        return self.norm(h)

    @property
    def slides(self) -> bool:
        return any(layer.self_attn.sliding_window is not None for layer in self.layers)

    def propose(self, block_embeds: mx.array, ctx_kv: list, offset, visible=None) -> mx.array:
        """The same as calling the model, as the engine runs it. With DFLASH_COMPILE_DRAFT=1 each
        layer's work before and after its attention is one compiled graph (a fixed shape for
        a block size; the offset an array, so a longer context is no new shape), for a GPU, where a
        small draft's forward is bound by the host's graph building and launches. Its weights are fixed
        once first used so (an inference path: the trainer calls the model)."""
        if not _compile_draft():
            return self(block_embeds, ctx_kv, offset, visible)
        compiled = self.__dict__.get("_compiled")  # kept off the module's tree of parameters
        if compiled is None:
            compiled = [(mx.compile(layer.project), mx.compile(layer.finish)) for layer in self.layers]
            object.__setattr__(self, "_compiled", compiled)
        h, at = block_embeds, mx.array(offset)
        for layer, (k, v), (project, finish) in zip(self.layers, ctx_kv, compiled):
            mask = None if visible is not None else _window_mask(layer, offset, h.shape[1], k)
            out = layer.self_attn.attend(*project(h, at), k, v, mask, visible)
            h = finish(h, out)
        return self.norm(h)


COMPILE_ENV = "DFLASH_COMPILE_DRAFT"


def _compile_draft() -> bool:
    return os.environ.get(COMPILE_ENV, "0") == "1"


DRAFT_VOCAB_FILE = "draft_vocab.json"  # {"tokens": [...]}: DraftConfig.draft_vocab, beside config.json

QUANT_GROUP = 64  # MLX's default group size: a quantized layer's input size must be a multiple of it


def quantize_draft(draft: DraftModel, bits: int) -> list:
    """Quantize the draft's linear layers in place (MLX affine, 4 or 8 bits), for memory. The draft
    only proposes and the target verifies every token, so the output stays the target's own; only
    acceptance can change. A layer whose input size is not a multiple of the group size cannot be
    quantized by MLX and keeps full precision: returns those layers' names."""
    kept = []

    def quantizable(path: str, module) -> bool:
        if not isinstance(module, nn.Linear):
            return False
        if module.weight.shape[-1] % QUANT_GROUP:
            kept.append(path)
            return False
        return True

    nn.quantize(draft, group_size=QUANT_GROUP, bits=bits, class_predicate=quantizable)
    return kept


def _window_mask(layer: DraftLayer, offset: int, block_len: int, ctx_k) -> mx.array | None:
    """Full-attention layers need no mask (bidirectional over context and block), nor a sliding
    window that holds the whole context and block (the reference masks as soon as they exceed it:
    the block's last query may then not see the oldest context)."""
    window = layer.self_attn.sliding_window
    if window is None or ctx_k is None or offset + block_len <= window:
        return None
    q_pos = offset + mx.arange(block_len)[:, None]
    k_pos = mx.concatenate([mx.arange(ctx_k.shape[2]), offset + mx.arange(block_len)])[None]
    return (q_pos - k_pos) < window


class DraftContext:
    """The draft's context K/V per layer, grown by the committed positions' target features."""

    def __init__(self, draft: DraftModel):
        self.draft = draft
        self.caches = [KVCache() for _ in draft.layers]  # grows in preallocated steps
        self.kv = [(None, None) for _ in draft.layers]
        self.length = 0
        self.device_length = None  # see on_device

    def extend(self, taps: list, kept: mx.array = None):
        """Grow by the taps' positions; on the device (see on_device), by the first `kept` of them."""
        feats = self.draft.context_features(taps)
        self.kv = [
            cache.update_and_fetch(*layer.self_attn.keys_values(feats, self.length))
            for layer, cache in zip(self.draft.layers, self.caches)
        ]
        if kept is None:
            self.length += feats.shape[1]
        else:
            self.device_length.advance(kept, feats.shape[1])
            self.length = self.device_length.offset

    def on_device(self, capacity: int = None) -> DeviceLength:
        """Keep the length on the device (dflash_core.engine.device_cache): `length` becomes an
        array, extend takes how many of its positions to keep, and the draft attends through
        `visible`. With `capacity` the caches have that fixed size, and `kv` their whole buffers."""
        self.caches, self.device_length = on_device(self.caches, capacity)
        self.length = self.device_length.offset
        if capacity is not None:
            self.kv = [(c.keys, c.values) for c in self.caches]
        return self.device_length

    def off_device(self, length: int):
        self.caches = [c.to_kv_cache(length) for c in self.caches]
        self.kv = [c.keys_and_values() for c in self.caches]
        self.length, self.device_length = length, None

    def visible(self, block_len: int) -> mx.array | None:
        """On the device: how many keys of [block ; context] the block sees (the context's rows
        past its length do not count; see Attention.attend); None otherwise."""
        return None if self.device_length is None else self.device_length.visible(block_len)

    def feed(self, taps: list):
        """extend, computed now: the prompt's part of the context is prefill's work. Left lazy, it
        was computed by the first cycle's evaluation and timed as decoding (on a CPU about a second
        for a 3,800-token prompt, 4% of that request's decoding), and every chunk's taps stayed in
        memory until then."""
        self.extend(taps)
        mx.eval(self.kv)

    def restore(self, kv: list, length: int):
        """Start from a prefix's context instead: each layer's (keys, values) of `length`
        positions (a prefix snapshot's; dflash_core.engine.prefix_cache)."""
        for cache, (k, v) in zip(self.caches, kv):
            cache.state = (k, v, length)
        self.kv = list(kv)
        self.length = length
