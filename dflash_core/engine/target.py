"""Any mlx-lm model as a DFlash target: hidden-state taps, verify forwards, exact rollback.

mlx-lm's model files stay untouched: the tapped decoder layers (and, in GatedDeltaNet layers, the
conv1d and the recurrence function) are given thin recording subclasses / wrappers at load time,
so new mlx-lm releases keep working.
"""

import copy
import sys
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import gather_last_axis
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from ..errors import DFlashError
from . import few_rows_matmul, fused_attention
from .device_cache import DeviceLength, on_device

PREFILL_CHUNK = 512
# The mlx-lm model modules (after mlx-lm's renames: a "mistral" config runs llama's) whose caches
# DFlash rolls back exactly, each tested in tests/test_engine.py: attention caches are trimmed
# (sliding-window ones too, gpt_oss's with attention sinks: the sinks are weights, not cache),
# GatedDeltaNet layers (qwen3_5, qwen3_next) replayed from a tape; MoE layers keep no state. Other
# recurrent layers (Mamba, Mamba-2, short convolutions: mamba, nemotron_h, jamba, lfm2, ...) keep a
# state that can be neither, so their targets are refused at load instead of failing on the first
# rejection.
SUPPORTED_ARCHITECTURES = (
    "gemma3_text",
    "gemma4",
    "gemma4_text",
    "gpt_oss",
    "llama",
    "qwen3",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_moe",
    "qwen3_next",
)
# Text models (by module) that scale their input embeddings inside their forward, Gemma's by
# sqrt(hidden) (gemma3_text rounds the factor to bfloat16 first): Target.embed scales the same way,
# so the draft's block is embedded exactly as the target embeds its own input (the reference
# implementations embed it with Gemma's scaled embedding module).
INPUT_EMBEDDING_SCALE = {
    "gemma3_text": lambda inner, h: h * mx.array(inner.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype),
    "gemma4_text": lambda inner, h: h * inner.embed_scale,
}


@dataclass
class GDNTape:
    """What one GatedDeltaNet layer saw during the last verify forward."""

    conv_input: mx.array  # [old conv state ; this forward's qkv rows], (1, K-1+S, conv_dim)
    args: tuple  # gated_delta_update's arguments (q, k, v, a, b, A_log, dt_bias, state_before)
    kwargs: dict


@dataclass
class DraftHead:
    """The LM head the draft proposes through. With a vocabulary (`tokens`: the ids of its rows)
    it computes only those rows: on a CPU the full head over B-1 positions costs more than the
    draft's layers, and a few thousand tokens cover nearly all that a chat model writes (FR-Spec,
    Zhao et al. 2025). The target verifies every proposal with its full head, so the output is
    unchanged; only a proposal the vocabulary lacks is lost."""

    logits: object  # hidden states -> logits over the rows
    tokens: mx.array | None  # the rows' token ids; None: the whole vocabulary, in order
    vocab_size: int  # the target's vocabulary (with `tokens`)

    def token_ids(self, rows: mx.array) -> mx.array:
        return rows if self.tokens is None else self.tokens[rows]

    def spread(self, probs: mx.array) -> mx.array:
        """(n, rows) probabilities -> (n, vocabulary), zero outside the rows."""
        if self.tokens is None:
            return probs
        full = mx.zeros((probs.shape[0], self.vocab_size), dtype=probs.dtype)
        full[:, self.tokens] = probs
        return full


class _Recorder:
    """Shared between the wrappers: where taps and tapes go during a forward."""

    def __init__(self):
        self.hidden = None  # {layer index: output} while a forward is recording
        self.conv = None  # [conv_input, ...] in GatedDeltaNet call order
        self.gdn = None  # [(args, kwargs), ...] in GatedDeltaNet call order


_ACTIVE: _Recorder | None = None  # the recorder of the forward in progress (one MLX thread)


def _tap_layer(layer, index: int):
    cls = type(layer)
    if getattr(cls, "_dflash_tap", False):  # another Target on the same model did it
        return

    def __call__(self, *args, **kwargs):
        out = cls.__call__(self, *args, **kwargs)
        if _ACTIVE is not None and _ACTIVE.hidden is not None:
            hidden = out[0] if isinstance(out, tuple) else out  # gemma4's layers also return their K/V
            _ACTIVE.hidden[index] = hidden
        return out

    layer.__class__ = type(f"Tapped{cls.__name__}", (cls,), {"__call__": __call__, "_dflash_tap": True})


def _tap_conv(conv):
    cls = type(conv)
    if getattr(cls, "_dflash_tap", False):
        return

    def __call__(self, x):
        if _ACTIVE is not None and _ACTIVE.conv is not None:
            _ACTIVE.conv.append(x)
        return cls.__call__(self, x)

    conv.__class__ = type(f"Taped{cls.__name__}", (cls,), {"__call__": __call__, "_dflash_tap": True})


def _tap_recurrence(module_name: str):
    """Wrap the module-level gated_delta_update that a GatedDeltaNet class calls."""
    mod = sys.modules[module_name]
    fn = mod.gated_delta_update
    if getattr(fn, "_dflash_original", None) is not None:
        return fn._dflash_original

    def gated_delta_update(*args, **kwargs):
        if _ACTIVE is not None and _ACTIVE.gdn is not None:
            _ACTIVE.gdn.append((args, kwargs))
        return fn(*args, **kwargs)

    gated_delta_update._dflash_original = fn
    mod.gated_delta_update = gated_delta_update
    return fn


def _is_gdn(module) -> bool:
    return hasattr(module, "conv1d") and hasattr(module, "A_log")


class Target:
    """A loaded mlx-lm model plus one generation's cache."""

    def __init__(self, model, tap_ids: list):
        self.model = model
        fused_attention.install(model)  # a GPU's few-row verify attention; nothing on a CPU
        few_rows_matmul.install(model)  # and its few-row float32 matrix products (CUDA)
        owner = self._text_owner(model)
        self.inner = owner.model  # embed_tokens, layers, norm
        lm_head = getattr(owner, "lm_head", None)
        self._head_module = lm_head or self.inner.embed_tokens  # tied: the embedding's rows
        head = lm_head or self._tied_head(self.inner.embed_tokens)
        group = getattr(owner, "sharding_group", None)  # mlx-lm splits qwen3_5's LM head by vocabulary
        self._softcap = getattr(owner, "final_logit_softcapping", None)  # gemma4 caps its logits
        self.head = self._capped(head if group is None else lambda h: gather_last_axis(head(h), group))
        self._sharded_head = group is not None
        self._embed_scale = INPUT_EMBEDDING_SCALE.get(type(self.inner).__module__.rsplit(".", 1)[-1])
        self._draft_head = (None, None)  # (the vocabulary it was made for, its DraftHead)
        self.layers = model.layers
        self.tap_ids = list(tap_ids)
        self.gdn_layers = []  # (cache index, GatedDeltaNet module, original recurrence)
        for i, layer in enumerate(self.layers):
            if i in self.tap_ids:
                _tap_layer(layer, i)
            for child in (getattr(layer, "linear_attn", None), getattr(layer, "mixer", None)):
                if child is not None and _is_gdn(child):
                    _tap_conv(child.conv1d)
                    recurrence = _tap_recurrence(type(child).__module__)
                    self.gdn_layers.append((i, child, recurrence))
        self._gdn_ids = {i for i, _, _ in self.gdn_layers}  # cache indices rollback rebuilds
        self.cache = None
        self._tapes = None
        self.compiled_cycles = {}  # pipeline.compiled_cycles: graphs traced on this target

    @staticmethod
    def _tied_head(embed):
        """The LM head of tied weights: the embedding's rows as a linear map (a float one through
        few_rows_matmul, which is MLX's own product wherever its kernel is off)."""
        if type(embed) is not nn.Embedding:  # quantized: its own as_linear
            return embed.as_linear
        return lambda h: few_rows_matmul.matmul_t(h, embed.weight)

    @staticmethod
    def _text_owner(model):
        """The module holding `model` (embeddings, layers) and `lm_head`; VLM-style wrappers such
        as qwen3_5 nest it under `language_model`. Asked before anything else of a loaded target
        (load_pair's check_fit, Target), so an architecture DFlash cannot serve is refused here."""
        check_architecture(model)
        return model.language_model if hasattr(model, "language_model") else model

    @staticmethod
    def text_model(model):
        return Target._text_owner(model).model

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hybrid(self) -> bool:
        return bool(self.gdn_layers)

    def embed(self, ids: mx.array) -> mx.array:
        """Token embeddings as the target's forward feeds them to its first layer."""
        h = self.inner.embed_tokens(ids)
        return h if self._embed_scale is None else self._embed_scale(self.inner, h)

    def _capped(self, logits):
        """The LM head `logits` followed by the model's logit soft-capping, where it has one."""
        cap = self._softcap
        return logits if not cap else lambda h: mx.tanh(logits(h) / cap) * cap

    def draft_head(self, vocab: tuple | None) -> "DraftHead":
        """The LM head the draft proposes through: the target's, or with `vocab` (the draft's
        vocabulary, DraftConfig.draft_vocab) only those rows. Made once per vocabulary."""
        made_for, head = self._draft_head
        if vocab is made_for and head is not None:
            return head
        if vocab is None or self._sharded_head:  # a vocabulary-split head stays whole
            head = DraftHead(self.head, None, 0)
        else:
            ids = mx.array(vocab)
            rows = copy.copy(self._head_module)  # the same layer (plain or quantized) over those rows
            for name in ("weight", "scales", "biases", "bias"):
                if name in rows:
                    rows[name] = mx.contiguous(rows[name][ids])
            mx.eval(rows.parameters())
            head = DraftHead(
                self._capped(rows.as_linear if hasattr(rows, "as_linear") else rows),
                ids,
                self._head_module["weight"].shape[0],
            )
        self._draft_head = (vocab, head)
        return head

    def reset(self):
        self.cache = make_prompt_cache(self.model)
        self._tapes = None

    def _recorded(self, ids: mx.array, cache, tape_gdn: bool):
        """Run the text model on ids (batch, length) while the wrappers record; returns the
        normed final hidden, the recorder."""
        global _ACTIVE
        rec = _Recorder()
        rec.hidden = {}
        if tape_gdn and self.gdn_layers:
            rec.conv, rec.gdn = [], []
        _ACTIVE = rec
        try:
            h = self.inner(ids, cache=cache)
        finally:
            _ACTIVE = None
        return h, rec

    def _forward(self, ids, tape_gdn: bool):
        """(normed final hidden, [tapped hidden states in tap_ids order]) through the cache;
        ids: a list, or a 1-D array still on the device."""
        ids = mx.array(ids)[None] if isinstance(ids, list) else ids[None]
        h, rec = self._recorded(ids, self.cache, tape_gdn)
        self._tapes = (
            [GDNTape(c, args, kw) for c, (args, kw) in zip(rec.conv, rec.gdn)] if rec.gdn is not None else None
        )
        return h, [rec.hidden[i] for i in self.tap_ids]

    def sequence_taps(self, ids: mx.array) -> list:
        """Tapped hidden states of whole sequences (batch, length), without the cache: what the
        draft trainer reads, recorded exactly as prefill and verify record them."""
        _, rec = self._recorded(ids, None, False)
        return [rec.hidden[i] for i in self.tap_ids]

    def resume(self, cache: list):
        """Take caches that already hold a prefix (restored from a prefix snapshot) instead of
        fresh ones; prefill(start=...) then feeds the rest."""
        self.cache, self._tapes = cache, None

    def prefill(self, ids: list, on_taps=None, start: int = 0):
        """Feed the prompt, chunked; the last token alone (as mlx-lm does), so its logits match
        plain greedy decoding's. on_taps(taps) receives each chunk's tapped hidden states.
        With start > 0 the cache already holds ids[:start] (see resume) and only the rest is fed.
        Returns the last position's logits."""
        if start == 0:
            self.reset()
        for chunk in range(start, len(ids) - 1, PREFILL_CHUNK):
            _, taps = self._forward(ids[chunk : min(chunk + PREFILL_CHUNK, len(ids) - 1)], False)
            if on_taps:
                on_taps(taps)
            mx.eval([c.state for c in self.cache], *taps)
        h, taps = self._forward(ids[-1:], False)
        if on_taps:
            on_taps(taps)
        return self.head(h[:, -1])[0]

    def step(self, token: mx.array):
        """A plain one-token step (token: shape (1,), on the device, possibly not computed yet):
        the logits after it and its taps. Nothing to roll back, so no GDN tapes."""
        h, taps = self._forward(token, tape_gdn=False)
        return self.head(h[:, -1])[0], taps

    def verify(self, ids: list):
        """One forward over the block; logits for every position, taps, and GDN tapes."""
        h, taps = self._forward(ids, tape_gdn=True)
        return self.head(h)[0], taps

    def rollback(self, kept: int, fed: int):
        """Make the cache hold exactly the committed tokens: of the `fed` tokens of the last
        verify, keep the first `kept`. A verify whose tokens were all kept needs nothing undone."""
        for (i, module, recurrence), tape in zip(self.gdn_layers, self._tapes or ()):
            if kept < fed:
                rollback_gdn(self.cache[i], tape, kept, module.conv_kernel_size, recurrence)
        for i, c in enumerate(self.cache):
            if i not in self._gdn_ids:
                rollback_kv(c, fed - kept)
        self._tapes = None

    def plain_kv(self) -> bool:
        """Whether every cache is mlx-lm's plain KVCache: one that can be cut back to any length
        (a prefix snapshot) and that a DeviceKVCache can stand in for (pipelined cycles)."""
        return all(type(c) is KVCache for c in self.cache)

    def on_device(self, capacity: int = None) -> DeviceLength:
        """Caches whose length lives on the device (plain_kv targets; see device_cache), of a fixed
        `capacity` where given."""
        self.cache, length = on_device(self.cache, capacity)
        return length

    def off_device(self, length: int):
        """mlx-lm's caches again, holding `length` entries."""
        self.cache = [c.to_kv_cache(length) for c in self.cache]

    def gdn_state(self):
        """What rollback recomputes (attention rollback is only an offset change)."""
        return [self.cache[i].cache for i, _, _ in self.gdn_layers]


def check_architecture(model):
    arch = type(model).__module__.rsplit(".", 1)[-1]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise DFlashError(
            f"the target's architecture '{getattr(model, 'model_type', arch)}' is not supported: DFlash must "
            "undo the target's cache after rejected proposals, which it can for "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} models only"
        )


def rollback_kv(cache, n_drop: int):
    """Attention caches: forget the last n_drop entries."""
    if n_drop and cache.trim(n_drop) != n_drop:
        raise RuntimeError(f"{type(cache).__name__} could not drop {n_drop} entries")
    if n_drop and isinstance(cache, RotatingKVCache):
        # A sliding window's buffer after a many-row verify is in temporal order, and trim() only
        # moves its write index: the dropped entries stay at the end. A one-token step (a plain
        # step) writes in place and takes the whole buffer as the window, so cut them off.
        cache.keys, cache.values = cache.keys[..., : cache._idx, :], cache.values[..., : cache._idx, :]


def rollback_gdn(cache: ArraysCache, tape: GDNTape, kept: int, kernel: int, recurrence):
    """GatedDeltaNet caches cannot be trimmed: rebuild them for the first `kept` steps.
    Conv state = the last kernel-1 rows of [old state ; accepted inputs]; the recurrent state is
    replayed from the pre-verify state over the accepted steps only (tape replay)."""
    cache[0] = mx.contiguous(tape.conv_input[:, kept : kept + kernel - 1])
    q, k, v, a, b, A_log, dt_bias, state = tape.args[:8]
    rest = tuple(x[:, :kept] if isinstance(x, mx.array) else x for x in tape.args[8:])  # mask
    _, cache[1] = recurrence(
        q[:, :kept],
        k[:, :kept],
        v[:, :kept],
        a[:, :kept],
        b[:, :kept],
        A_log,
        dt_bias,
        state,
        *rest,
        **tape.kwargs,
    )
