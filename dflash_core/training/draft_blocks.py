"""The draft recipe's blocks and loss: anchors sampled among response positions, block k
`[token[a], MASK x (B-1)]` through the inference model's own modules over the target's taps, each
position weighted exp(-(j-1)/gamma); batches, the cached taps, the validation loss."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..engine.draft import DraftConfig, DraftModel
from ..engine.target import Target
from .draft_data import Sequences

GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def loss_gamma(block_size: int) -> float:
    return GAMMA.get(block_size, max(2.0, 7.0 * block_size / 16))


def tapped_hidden(target: Target, ids: mx.array) -> list:
    """The target's hidden states at the draft's tap layers for a batch (B, L), no cache: the
    same recording the engine's Target does during prefill and verify."""
    return [mx.stop_gradient(h) for h in target.sequence_taps(ids)]


def block_logits(draft: DraftModel, head, taps: list, block_embeds, anchors, seq_of_block):
    """Draft logits for blocks at positions 1..B-1. taps: per tap (S, L, h) target hidden states;
    block_embeds (N, B, h); anchors (N,) absolute positions; seq_of_block (N,) sequence index."""
    feats = draft.context_features(taps)  # (S, L, h)
    L = feats.shape[1]
    N, B, _ = block_embeds.shape
    ctx_pos = mx.arange(L)
    sees_ctx = ctx_pos[None, :] < anchors[:, None]  # (N, L): strictly before the anchor
    h = block_embeds
    for layer in draft.layers:
        attn = layer.self_attn
        k, v = attn.keys_values(feats, 0)  # (S, kv, L, d), positions 0..L-1
        ctx_mask = sees_ctx[:, None, :]
        if attn.sliding_window is not None:
            q_pos = anchors[:, None] + mx.arange(B)[None]
            ctx_mask = ctx_mask & ((q_pos[:, :, None] - ctx_pos[None, None]) < attn.sliding_window)
        ctx_mask = mx.broadcast_to(ctx_mask, (N, B, L))
        mask = mx.concatenate([ctx_mask, mx.ones((N, B, B), dtype=mx.bool_)], axis=-1)[:, None]
        # the inference layer itself, with a per-block offset (RoPE takes an array) and the mask
        h = layer(h, k[seq_of_block], v[seq_of_block], anchors, mask)
    return head(draft.norm(h)[:, 1:])


def make_batch(data: "Sequences", rows, n_anchors: int, cfg: DraftConfig, weights_k, rng) -> tuple:
    """The blocks of one step for these sequences: block token ids `[token@anchor, MASK...]`,
    anchors, each block's sequence, labels at block positions 1..B-1 and their loss weights
    (zero for unused anchor slots), and how many blocks are real."""
    B = cfg.block_size
    anchors, valid = data.anchors(rows, n_anchors, B, rng)
    ids = data.ids[rows]
    flat = anchors.reshape(-1)
    seq_of_block = np.repeat(np.arange(len(rows)), n_anchors)
    block_ids = np.full((len(flat), B), cfg.mask_token_id, dtype=np.int32)
    block_ids[:, 0] = ids[seq_of_block, flat]
    label_pos = flat[:, None] + np.arange(1, B)[None]
    labels = ids[seq_of_block[:, None], np.minimum(label_pos, data.length - 1)]
    weights = weights_k[None] * mx.array(valid.reshape(-1, 1).astype(np.float32))
    return block_ids, flat, seq_of_block, labels, weights, int(valid.sum())


def draft_loss(draft, head, taps, block_embeds, anchors, seq_of_block, labels, weights, teacher=None, distill=0.0):
    """Cross-entropy on the target's greedy tokens, weighted by block position; with distill > 0,
    mixed with the cross-entropy on the target's whole distribution there (`teacher` logits)."""
    logits = block_logits(draft, head, taps, block_embeds, anchors, seq_of_block).astype(mx.float32)
    ce = nn.losses.cross_entropy(logits, labels, reduction="none")
    if distill:
        soft = -(mx.softmax(teacher, axis=-1) * nn.log_softmax(logits, axis=-1)).sum(axis=-1)
        ce = (1 - distill) * ce + distill * soft
    return (ce * weights).sum() / mx.maximum(weights.sum(), 1e-6)


def teacher_logits(head, final_hidden, anchors, seq_of_block, block_size: int):
    """The target's own logits for each block's labels, from its normed final hidden states
    (S, L, h): position i predicts token i + 1, so the labels at anchor + 1 .. anchor + B - 1 come
    from anchor .. anchor + B - 2."""
    pos = anchors[:, None] + mx.arange(block_size - 1)[None]
    h = final_hidden[seq_of_block[:, None], pos]  # (blocks, B - 1, hidden)
    return mx.stop_gradient(head(h).astype(mx.float32))


def shuffled_batches(rows: np.ndarray, size: int, rng):
    """Batches of `size` rows for ever: each epoch every row once, in a new order."""
    while True:
        order = rng.permutation(rows)
        for s in range(0, len(order), size):
            yield order[s : s + size]


class Blocks:
    """The inputs of a training step for some of the data's sequences: the target's taps (with
    distill, then its normed final hidden state: the teacher), the anchors' blocks embedded by
    the target, their labels and loss weights (see make_batch). The target is frozen: with
    cache_taps its taps are computed once for all steps."""

    def __init__(
        self,
        data: Sequences,
        target: Target,
        cfg: DraftConfig,
        n_anchors: int,
        distill: bool,
        cache_taps: bool,
        log=print,
    ):
        self.data, self.target, self.cfg, self.n_anchors, self.distill = data, target, cfg, n_anchors, distill
        self.n_taps = len(cfg.target_layer_ids)
        B = cfg.block_size
        self.weights_k = mx.array([math.exp(-(k - 1) / loss_gamma(B)) for k in range(1, B)])
        self.cached = cached_taps(target, data.ids, log) if cache_taps else None

    def taps(self, rows) -> list:
        if self.cached is None:
            taps = tapped_hidden(self.target, mx.array(self.data.ids[rows]))
        else:
            taps = [t[mx.array(rows)] for t in self.cached]
        if self.distill:  # normed out here: MLX's compiled step refused the target's norm inside it
            last = self.target.tap_ids.index(self.target.num_layers - 1)
            return taps[: self.n_taps] + [self.target.inner.norm(taps[last])]
        return taps

    def __call__(self, rows, rng) -> tuple:
        """(inputs of the step, how many of its blocks are real)."""
        block_ids, anchors, seq_of_block, labels, weights, n_blocks = make_batch(
            self.data, rows, self.n_anchors, self.cfg, self.weights_k, rng
        )
        inputs = (
            self.taps(rows),
            self.target.embed(mx.array(block_ids)),
            mx.array(anchors),
            mx.array(seq_of_block),
            mx.array(labels),
            weights,
        )
        return inputs, n_blocks


def cached_taps(target: Target, ids: np.ndarray, log=print) -> list:
    """The target's taps for all the sequences (memory: sequences x length x hidden x taps)."""
    per_tap = [[] for _ in target.tap_ids]
    for r in range(0, len(ids), 64):
        taps = tapped_hidden(target, mx.array(ids[r : r + 64]))
        mx.eval(taps)
        for chunks, t in zip(per_tap, taps):
            chunks.append(t)
    cached = []
    for k in range(len(per_tap)):  # one tap at a time, freeing its chunks: peak ~(1 + 1/taps) x the cache
        cached.append(mx.concatenate(per_tap[k]))
        mx.eval(cached[-1])
        per_tap[k] = None
    log(f"cached the target's taps for {len(ids)} sequences")
    return cached


def block_loss(head, cfg: DraftConfig, distill: float):
    """loss(draft, *inputs of Blocks) for make_step: draft_loss, with distill > 0 against the
    teacher that ends the taps too."""
    n_taps = len(cfg.target_layer_ids)

    def loss(draft, taps, block_embeds, anchors, seq_of_block, labels, weights):
        teacher = teacher_logits(head, taps[n_taps], anchors, seq_of_block, cfg.block_size) if distill else None
        return draft_loss(
            draft, head, taps[:n_taps], block_embeds, anchors, seq_of_block, labels, weights, teacher, distill
        )

    return loss


def validation_loss(draft, blocks: Blocks, rows, batch_size: int) -> float:
    """The loss on these sequences, on the greedy tokens alone (whatever --distill is, so runs
    compare), with the same anchors every time."""
    loss = block_loss(blocks.target.head, blocks.cfg, 0.0)
    rng, total, weight = np.random.default_rng(0), 0.0, 0.0
    for r in range(0, len(rows), batch_size):
        inputs, _ = blocks(rows[r : r + batch_size], rng)
        w = inputs[-1].sum().item()
        total, weight = total + loss(draft, *inputs).item() * w, weight + w
    return total / max(weight, 1e-6)
