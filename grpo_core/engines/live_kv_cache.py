"""The in-process engine's KV cache sized by what is live: each layer's keys and values in one
buffer written in place, holding the live rows' filled positions plus at most a block of free
ones (docs/engines.md, "Long outputs")."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

# The KV cache grows by this many positions per layer at a time: one copy of the cache per
# block (1/256 of the attention reads of those steps), at most a block of free positions.
KV_BLOCK_TOKENS = 256


class PreallocatedLayer(DynamicLayer):
    """A DynamicLayer whose keys/values live in a buffer written in place, sized by what is live.

    DynamicLayer concatenates each step's key/value onto the cache, copying the whole cache
    per token (for the 25M-parameter bench policy that copy was most of the sampling time);
    here each step writes its token in place and attention reads a view of the filled part.
    The buffer holds the filled positions plus up to `block` free ones: it grows by a block
    when decoding reaches its end and is cut back when finished rows leave, never past `limit`
    (prompt width + max_new_tokens), so its memory follows the live rows, not rows x limit.
    """

    def __init__(
        self, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor, limit: int, block: int
    ) -> None:
        """Row i holds row `rows[i]` of the prefill's `keys`/`values`."""
        super().__init__()
        self._limit, self._block = limit, block
        self._length = keys.shape[-2]
        capacity = self._capacity_for(self._length)
        self._k = _resized(keys, rows, self._length, capacity)
        self._v = _resized(values, rows, self._length, capacity)
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._views()

    @property
    def capacity(self) -> int:
        """Positions the buffer holds now (filled or free)."""
        return int(self._k.shape[-2])

    @property
    def nbytes(self) -> int:
        """Bytes its key and value buffers hold (allocated, filled or not)."""
        return int(self._k.nbytes + self._v.nbytes)

    def _capacity_for(self, length: int) -> int:
        return min(self._limit, length + self._block)

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._k[:, :, : self._length], self._v[:, :, : self._length]
        self.keys, self.values = keys, values
        return keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._length + key_states.shape[-2]
        if end > self._limit:
            raise RuntimeError(f"KV cache holds {self._limit} tokens, {end} needed")
        if end > self.capacity:
            capacity = self._capacity_for(end)
            self._k = _resized(self._k, slice(None), self._length, capacity)
            self._v = _resized(self._v, slice(None), self._length, capacity)
        self._k[:, :, self._length : end] = key_states
        self._v[:, :, self._length : end] = value_states
        self._length = end
        return self._views()

    def get_seq_length(self) -> int:
        return self._length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        capacity = self._capacity_for(self._length)
        self._k = _resized(self._k, indices, self._length, capacity)
        self._v = _resized(self._v, indices, self._length, capacity)
        self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


def _resized(
    buffer: torch.Tensor, rows: torch.Tensor | slice, length: int, capacity: int
) -> torch.Tensor:
    """A new (rows, heads, capacity, dim) buffer holding `rows` of `buffer` (only its first
    `length` positions copied)."""
    kept = buffer[rows, :, :length]
    out = buffer.new_empty((kept.shape[0], buffer.shape[1], capacity, buffer.shape[-1]))
    out[:, :, :length] = kept
    return out


def preallocate_cache(
    cache: Any, rows: torch.Tensor, limit: int, block: int = KV_BLOCK_TOKENS
) -> bool:
    """Turn a prefilled DynamicCache into one in-place buffer per layer that grows by `block`
    positions up to `limit`, holding row `rows[i]` of the prefill as row i. False (cache
    untouched) for other cache types (sliding-window, hybrid, ...), which then keep their own
    update rule."""
    layers = getattr(cache, "layers", None)
    if not isinstance(cache, DynamicCache) or not layers:
        return False
    if any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return False
    cache.layers = [
        PreallocatedLayer(layer.keys, layer.values, rows, limit, block) for layer in layers
    ]
    return True
