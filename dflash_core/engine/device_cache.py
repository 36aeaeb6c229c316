"""Attention caches whose length lives on the device, for cycles that never wait for their own
outcome (dflash_core.engine.pipeline).

After a verify the host does not know how many of its rows the target kept until it reads the
result back, which on a GPU drains the pipeline. These caches write every row a forward feeds at
their length on the device, then advance that length by the kept count, itself an array computed
on the device; the host keeps only an upper bound (`bound`) to size what it slices. Rows past the
length hold rejected tokens until the next forward writes over them, and the masks hide them.
"""

import mlx.core as mx
from mlx_lm.models.cache import KVCache


class DeviceLength:
    """The length that a model's caches share (all its layers hold the same positions)."""

    def __init__(self, length: int):
        self.offset = mx.array(length, dtype=mx.int32)
        self.bound = length  # the host's upper bound of offset
        self._visible = {}

    def visible(self, fed: int) -> mx.array:
        """(1,) int32: the keys that count once a forward of `fed` rows is written (the fused
        attention's `valid`), made once per forward for all the layers."""
        v = self._visible.get(fed)
        if v is None:
            v = self._visible[fed] = (self.offset + fed).reshape(1)
        return v

    def set(self, offset: mx.array):
        """The length as an array computed elsewhere (a compiled cycle's output)."""
        self.offset = offset
        self._visible = {}

    def advance(self, kept: mx.array, fed: int):
        """After a forward of `fed` rows, of which the first `kept` (an array) are committed."""
        self.offset = self.offset + kept
        self.bound += fed
        self._visible = {}

    def settle(self, rejected: int):
        """The host has read that a forward's last `rejected` rows were not kept."""
        self.bound -= rejected


class DeviceKVCache:
    """mlx-lm's KVCache contract (update_and_fetch, offset, make_mask) over a DeviceLength."""

    step = 256  # grows like mlx-lm's KVCache

    def __init__(self, cache: KVCache, length: DeviceLength, capacity: int = None):
        self.keys, self.values = cache.keys, cache.values  # (1, kv heads, capacity, head dim)
        self.length = length
        self.fixed = capacity is not None  # forwards see the whole buffer, of this size
        if self.fixed:
            self.keys, self.values = (_sized(x, capacity) for x in (self.keys, self.values))

    @property
    def offset(self) -> mx.array:  # mlx-lm's attention reads it for RoPE
        return self.length.offset

    def to_kv_cache(self, length: int) -> KVCache:
        """mlx-lm's cache again, holding `length` entries (the host has read it by now)."""
        return KVCache.from_state((self.keys, self.values, length))

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        n, have = keys.shape[2], self.keys.shape[2]
        end = self.length.bound + n
        if end > have:
            grow = (end - have + self.step - 1) // self.step * self.step
            self.keys, self.values = (
                mx.concatenate([x, mx.zeros((*x.shape[:2], grow, x.shape[3]), x.dtype)], axis=2)
                for x in (self.keys, self.values)
            )
        at = self.length.offset.reshape(1)
        self.keys = mx.slice_update(self.keys, keys, at, axes=(2,))
        self.values = mx.slice_update(self.values, values, at, axes=(2,))
        if self.fixed:
            return self.keys, self.values
        return self.keys[..., :end, :], self.values[..., :end, :]

    def make_mask(self, n: int, return_array: bool = False, window_size=None) -> mx.array:
        """Query i, at position offset + i, sees the keys up to its own position (of those that
        update_and_fetch returns)."""
        keys = self.keys.shape[2] if self.fixed else self.length.bound + n
        return mx.arange(keys)[None] <= (self.offset + mx.arange(n))[:, None]


def _sized(x: mx.array, size: int) -> mx.array:
    """A cache buffer (1, heads, positions, dim) cut or zero-padded to `size` positions."""
    if x.shape[2] >= size:
        return x[..., :size, :]
    return mx.concatenate([x, mx.zeros((*x.shape[:2], size - x.shape[2], x.shape[3]), x.dtype)], axis=2)


def on_device(caches: list, capacity: int = None) -> tuple:
    """(DeviceKVCaches standing in for mlx-lm KVCaches of one model, their shared DeviceLength);
    with `capacity`, of that fixed size (it must hold every position the run will write)."""
    length = DeviceLength(caches[0].offset)
    return [DeviceKVCache(c, length, capacity) for c in caches], length
