"""A bounded LRU of prefix snapshots: a request whose prompt begins with tokens an earlier run
already fed restores the target's caches and the draft's context for them, and prefills only the
rest. Chat clients send the whole conversation each turn, so a turn pays for its new text alone.

A snapshot is taken where it is exact: after a prompt's prefill (with the prompt's last logits)
and at the end of a run (prompt + reply, without logits: the run's last logits were never kept).
It holds, copied (the caches write into their buffers in place later):
- attention (KVCache): keys and values of its positions;
- sliding window (RotatingKVCache): the whole window buffer, its offset and write index;
- GatedDeltaNet (ArraysCache): the conv state and the recurrent state;
- the draft's context: each draft layer's keys and values of the tapped features.
Attention keys and values (the draft's context too) can be cut back to any shorter prefix. A
sliding window that has wrapped and a GatedDeltaNet state cannot: a snapshot of a target with
either kind serves only prompts that extend its whole token sequence, so snapshots are stored at
the boundaries later requests resume from (a prompt's end, a reply's end).

Requests resume at most one token before their prompt's end, so that the last token is fed alone
as prefill feeds it (its logits match plain decoding's), unless a snapshot of exactly the prompt
has its logits. All of it runs on the MLX worker thread; /metrics reads the counters.
"""

from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from .draft import DraftContext
from .target import Target

DEFAULT_PREFIX_CACHE_MB = 1024  # serve --prefix-cache-mb


@dataclass
class Snapshot:
    tokens: tuple  # the token ids the caches hold
    target: list  # per target cache: (its class, its state with copied arrays)
    draft: list  # per draft layer: (keys, values) of the context, copied
    logits: mx.array | None  # after the last token; None: a prompt must extend the tokens
    cuttable: bool  # every target cache is plain attention: any shorter prefix can be restored
    nbytes: int


def held_length(caches: list) -> int:
    """Tokens the target's caches hold: every supported architecture has an attention layer."""
    return next(c.offset for c in caches if isinstance(c, (KVCache, RotatingKVCache)))


def _saved(cache, n: int):
    """(class, state) of one target cache holding n tokens, its arrays copied; None for a kind
    this module does not know (the target is then never snapshot)."""
    kind = type(cache)
    if kind is KVCache:
        return kind, (mx.array(cache.keys[..., :n, :]), mx.array(cache.values[..., :n, :]), n)
    if kind is RotatingKVCache:
        keys, values, *rest = cache.state
        return kind, (mx.array(keys), mx.array(values), *rest)
    if kind is ArraysCache:
        arrays, left_padding, lengths = cache.state
        return kind, ([None if a is None else mx.array(a) for a in arrays], left_padding, lengths)
    return None


def _restored(kind, state, n: int):
    """A new cache from a saved state (cut to n tokens where it is attention). Its arrays are
    new objects over the snapshot's: a cache's in-place writes replace them, never the snapshot's."""
    if kind is KVCache:
        keys, values, _ = state
        return KVCache.from_state((keys[..., :n, :], values[..., :n, :], n))
    if kind is RotatingKVCache:
        keys, values, *rest = state
        return RotatingKVCache.from_state((keys[...], values[...], *rest))
    arrays, left_padding, lengths = state
    return ArraysCache.from_state(([None if a is None else a[...] for a in arrays], left_padding, lengths))


def _common_length(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    """Snapshots keyed by their token ids, least recently used evicted first beyond max_bytes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._snapshots = OrderedDict()  # tokens -> Snapshot, least recently used first
        self.nbytes = 0
        self.hits = self.misses = self.reused_tokens = self.evictions = 0

    def __len__(self) -> int:
        return len(self._snapshots)

    def keys(self) -> list:
        return list(self._snapshots)

    def find(self, ids: list, use_logits: bool = True):
        """(snapshot, tokens of ids it restores) for the longest usable cached prefix, or None.
        `use_logits` False: never the whole prompt, its last token is fed (as plain decoding's
        generate_step feeds it)."""
        best, best_n = None, 0
        for snap in self._snapshots.values():
            common = _common_length(snap.tokens, ids)
            whole = common == len(snap.tokens)
            if whole and common == len(ids) and snap.logits is not None and use_logits:
                n = common  # exactly this prompt, its logits kept: nothing to feed
            elif snap.cuttable or (whole and common < len(ids)):
                n = min(common, len(ids) - 1)  # the last token is fed alone
            else:
                continue
            if n > best_n:
                best, best_n = snap, n
        return None if best is None else (best, best_n)

    def restore(self, snap: Snapshot, n: int, target: Target, ctx: DraftContext):
        """Put the first n tokens of a snapshot into the target's caches and the draft's context."""
        target.resume(self.target_caches(snap, n))
        ctx.restore([(k[..., :n, :], v[..., :n, :]) for k, v in snap.draft], n)

    def target_caches(self, snap: Snapshot, n: int) -> list:
        """New mlx-lm caches holding the first n tokens of a snapshot (plain decoding resumes
        from these: it has no draft context)."""
        self._snapshots.move_to_end(snap.tokens)
        return [_restored(kind, state, n) for kind, state in snap.target]

    def store(self, target: Target, ctx: DraftContext, tokens: list, logits: mx.array = None):
        """Snapshot the caches for the prefix of `tokens` they hold. After a run the target may
        hold fewer (a last token emitted but never fed) or more (a last cycle's tokens past an
        EOS), and the draft's context fewer (a plain step still in flight at the end); caches that
        cannot be cut back are snapshot only where both hold exactly a prefix of `tokens`."""
        held = held_length(target.cache)
        n = min(held, ctx.length, len(tokens))
        exact = held == ctx.length <= len(tokens)
        cuttable = target.plain_kv()
        key = tuple(tokens[:n])
        if n == 0 or not (exact or cuttable):
            return
        if key in self._snapshots:
            self._snapshots.move_to_end(key)
            if logits is None or self._snapshots[key].logits is not None:
                return
            self._drop(key)  # the same tokens, now with their logits
        saved = [_saved(c, n) for c in target.cache]
        if any(s is None for s in saved):
            return
        kept = mx.array(logits) if logits is not None and n == len(tokens) else None
        draft = [(mx.array(k[..., :n, :]), mx.array(v[..., :n, :])) for k, v in ctx.kv]
        arrays = [a for _, state in saved for a in _arrays_of(state)] + [a for kv in draft for a in kv]
        arrays += [] if kept is None else [kept]
        nbytes = sum(a.nbytes for a in arrays)
        if nbytes > self.max_bytes:
            return
        mx.eval(arrays)  # copy now: the caches go on writing into their buffers
        while self.nbytes + nbytes > self.max_bytes:
            self._drop(next(iter(self._snapshots)))
            self.evictions += 1
        self._snapshots[key] = Snapshot(key, saved, draft, kept, cuttable, nbytes)
        self.nbytes += nbytes

    def _drop(self, key: tuple):
        self.nbytes -= self._snapshots.pop(key).nbytes


def _arrays_of(state: tuple) -> list:
    """The arrays in a saved cache state (ArraysCache keeps a list of them)."""
    out = []
    for x in state:
        if isinstance(x, mx.array):
            out.append(x)
        elif isinstance(x, list):
            out += [a for a in x if a is not None]
    return out


def prefill(target: Target, ctx: DraftContext, ids: list, cache: PrefixCache | None) -> tuple:
    """The prompt's last logits after feeding it to the target (taps into the draft's context),
    and how many of its tokens a snapshot gave. With a cache, the longest cached prefix is
    restored and only the rest fed; the prompt is snapshot afterwards."""
    if cache is None:
        return target.prefill(ids, on_taps=ctx.feed), 0
    found = cache.find(ids)
    if found is None:
        cache.misses += 1
        logits, reused = target.prefill(ids, on_taps=ctx.feed), 0
    else:
        snap, reused = found
        cache.hits += 1
        cache.reused_tokens += reused
        cache.restore(snap, reused, target, ctx)
        logits = snap.logits if reused == len(ids) else target.prefill(ids, on_taps=ctx.feed, start=reused)
    cache.store(target, ctx, ids, logits)
    return logits, reused
