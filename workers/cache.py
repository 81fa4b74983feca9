"""KVCache: the per-layer keys/values a forward pass attends over.

Every cached token carries its logical position, so one rule masks every case
(prefill, decode, blended chunks, evicted caches): a query at position p sees
the cached tokens at positions <= p. Per-head retention (Ada-KV) compacts each
head on its own: `positions` becomes [kv_heads, T] (slot j of head h holds the
token at positions[h, j]) and the boolean `head_mask` marks padding slots of
heads that keep fewer than T tokens; per-layer lengths may differ (PyramidKV).

That padded layout costs the longest head. The packed layout costs exactly the kept
entries: every head's entries in one sequence (keys/values [1, N, D], positions [N]) and
`head_mask` [kv_heads, N] says which kv head owns each entry. Attention reads it as one
shared kv head whose entries each query head masks to its own kv head's (attention.py);
decode appends one entry per kv head (eviction/slots.py packs and unpacks).

A decode step adds one token to every layer. Where the layers share one shape and positions, KVCache.grow keeps
them over one set of buffers ([L, Hkv, C, D]) and grows them all with a few ops (`_Stack`), instead of a few per
layer (LayerKV.grow), and avx2.c reads every layer through one record a row (layer_stride): with both, a step
3-5% faster at batch 1 and 9-15% at 8-16 rows on the 2-core box. A layer replaced or grown on its own ends
that, and each layer grows by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvstore.kv import ChunkKV

GROWTH_TOKENS = 256  # room added when an append outgrows a layer's buffers (decode appends one token a step)


@dataclass
class LayerKV:
    keys: torch.Tensor  # [kv_heads, T, head_dim], RoPE applied at `positions`
    values: torch.Tensor  # [kv_heads, T, head_dim]
    positions: torch.Tensor  # [T] int64 logical positions; [kv_heads, T] when heads keep different tokens
    head_mask: torch.Tensor | None = None  # [kv_heads, T] bool, False = evicted for that head
    # buffers this layer allocated, with room behind the live views (see append)
    _room: "_Room | None" = field(default=None, init=False, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.head_mask.shape[0] if self.packed else self.keys.shape[0]

    def head_positions(self) -> torch.Tensor:
        """[kv_heads, T] logical position of every slot for every kv head (a shared layout's broadcast)."""
        return self.positions if self.positions.dim() == 2 else self.positions[None].expand(self.kv_heads, -1)

    def valid_mask(self) -> torch.Tensor:
        """[kv_heads, T] bool: the real entries of each kv head (not padding; in the packed layout, its own)."""
        if self.head_mask is not None:
            return self.head_mask
        return torch.ones(self.keys.shape[:2], dtype=torch.bool, device=self.keys.device)

    @property
    def head_length(self) -> int:
        """Entries of the longest kv head (= num_tokens, except in the packed layout)."""
        return int(self.head_mask.sum(dim=1).max()) if self.packed else self.num_tokens

    @property
    def packed(self) -> bool:
        """Heads packed into one sequence: keys [1, N, D], head_mask [kv_heads, N] = each entry's owner."""
        return self.head_mask is not None and self.keys.shape[0] == 1 < self.head_mask.shape[0]

    def nbytes(self) -> int:
        total = self.keys.nbytes + self.values.nbytes + self.positions.nbytes
        return total + (self.head_mask.nbytes if self.head_mask is not None else 0)

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Add tokens keys/values [Hkv, S, D] at positions [S] at the end (see reserve)."""
        key_slots, value_slots = self.reserve(positions, keys.dtype, values.dtype)
        key_slots.copy_(keys)
        value_slots.copy_(values)

    def grow(self, position: int, dtype: torch.dtype) -> bool:
        """Add one token at `position` in place, its keys/values (`dtype`) left for the caller to write at
        entry num_tokens - 1, when the layer can: a shared layout (no head mask), its own buffers of
        `dtype` behind its views, room for one more. Three views and one write, the fewest ops a decode
        step can pay per layer. False, with nothing changed, otherwise: use reserve."""
        room = self._room
        if (self.head_mask is not None or room is None or room.views[0] is not self.keys
                or room.views[1] is not self.values or room.views[2] is not self.positions
                or self.positions.dim() != 1 or self.keys.shape[1] >= room.capacity
                or room.buffers[0].dtype != dtype or room.buffers[1].dtype != dtype):
            return False
        keys, values, positions = room.buffers
        end = self.keys.shape[1] + 1
        positions[end - 1] = position
        room.views = (keys.narrow(1, 0, end), values.narrow(1, 0, end), positions.narrow(0, 0, end))
        self.keys, self.values, self.positions = room.views
        return True

    def reserve(self, positions: torch.Tensor, key_dtype: torch.dtype | None = None,
                value_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Grow by tokens at `positions` [S] and return their key and value slots [Hkv, S, D], to be
        written by the caller (the decode step writes them inside its layer function).

        The layer keeps buffers with room to spare, so a decode step adds a token in place instead of
        copying the whole layer (torch.cat). Only buffers this layer allocated itself, still behind the
        very tensors it last set, are written in place: a LayerKV built over another's tensors, or whose
        tensors were replaced, copies into fresh buffers first. A packed layer adds one entry per kv head
        and token, owned by that head."""
        heads, seq = self.kv_heads, positions.shape[0]
        fresh = None
        if self.packed:  # head-major entries: head h's S tokens, then head h + 1's
            added, positions = heads * seq, positions.repeat(heads)
            fresh = torch.eye(heads, dtype=torch.bool, device=positions.device).repeat_interleave(seq, dim=1)
        else:
            added = seq
            if self.positions.dim() == 2:  # per-head layout: every head gets the new tokens
                positions = positions[None, :].expand(heads, -1)
        dtypes = (key_dtype or self.keys.dtype, value_dtype or self.values.dtype, positions.dtype)
        length = self.keys.shape[1]
        room = self._room
        if not (room is not None and room.views[0] is self.keys and room.views[1] is self.values
                and room.views[2] is self.positions and length + added <= room.capacity
                and all(b.dtype == d for b, d in zip(room.buffers, dtypes))):
            room = self._room = _Room.around((self.keys, self.values, self.positions), added, dtypes)
        keys, values, all_positions = room.buffers
        all_positions[..., length:length + added] = positions
        end = length + added
        room.views = (keys[:, :end], values[:, :end], all_positions[..., :end])
        self.keys, self.values, self.positions = room.views
        if self.head_mask is not None:
            if fresh is None:
                fresh = torch.ones(heads, added, dtype=torch.bool, device=keys.device)
            self.head_mask = torch.cat([self.head_mask, fresh], dim=1)
        if self.packed:
            dim = keys.shape[-1]
            return keys[0, length:end].view(heads, seq, dim), values[0, length:end].view(heads, seq, dim)
        return keys[:, length:end], values[:, length:end]


@dataclass
class _Room:
    """Buffers (keys [H, C, D], values [H, C, D], positions [C] or [H, C]) with capacity C, and the
    leading views of them the layer holds."""

    buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    views: tuple
    capacity: int

    @classmethod
    def around(cls, current: tuple, added: int, dtypes: tuple) -> "_Room":
        """Fresh buffers holding `current`, with room for `added` entries (of `dtypes`) and
        GROWTH_TOKENS more."""
        length = current[0].shape[1]
        capacity = length + added + GROWTH_TOKENS
        buffers = []
        for i, (now, dtype) in enumerate(zip(current, dtypes)):
            dim = 1 if i < 2 else now.dim() - 1  # keys/values: tokens on dim 1; positions: the last
            shape = list(now.shape)
            shape[dim] = capacity
            buffer = now.new_empty(shape, dtype=torch.promote_types(now.dtype, dtype))
            buffer.narrow(dim, 0, length).copy_(now)
            buffers.append(buffer)
        return cls(tuple(buffers), current, capacity)


@dataclass
class _Stack:
    """Every layer of a cache over one set of buffers (keys/values [L, Hkv, C, D], positions [C] shared by the
    layers) and the views the layers hold, so that a decode step grows all of them by one token with a few ops
    instead of a few per layer (KVCache.grow)."""

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    views: tuple  # (keys per layer, values per layer, positions): what the layers were last given

    @classmethod
    def over(cls, layers: list[LayerKV], dtype: torch.dtype) -> "_Stack | None":
        """The layers copied into one stack with room, or None where they do not share one shape, dtype and
        positions (per-head layouts, evicted layers, another dtype)."""
        first = layers[0]
        if any(layer is None or layer.head_mask is not None or layer.positions.dim() != 1
               or layer.keys.shape != first.keys.shape or layer.keys.dtype != dtype or layer.values.dtype != dtype
               for layer in layers):
            return None
        if any(layer.positions is not first.positions and not torch.equal(layer.positions, first.positions)
               for layer in layers[1:]):
            return None
        heads, length, dim = first.keys.shape
        capacity = length + GROWTH_TOKENS
        keys = first.keys.new_empty(len(layers), heads, capacity, dim)
        values = torch.empty_like(keys)
        positions = first.positions.new_empty(capacity)
        for i, layer in enumerate(layers):
            keys[i, :, :length] = layer.keys
            values[i, :, :length] = layer.values
        positions[:length] = first.positions
        return cls(keys, values, positions, ((), (), None))

    def holds(self, layers: list[LayerKV]) -> bool:
        """Are `layers` still exactly the views this stack gave them (nothing replaced or regrown since)?"""
        keys, values, positions = self.views
        return len(keys) == len(layers) and all(
            layer.keys is k and layer.values is v and layer.positions is positions and layer.head_mask is None
            for layer, k, v in zip(layers, keys, values))

    def give(self, layers: list[LayerKV], length: int) -> None:
        """Every layer's views over the first `length` entries."""
        if length > self.keys.shape[2]:  # out of room: copied once into bigger buffers
            capacity = length + GROWTH_TOKENS
            keys = self.keys.new_empty(*self.keys.shape[:2], capacity, self.keys.shape[3])
            values = torch.empty_like(keys)
            positions = self.positions.new_empty(capacity)
            old = self.keys.shape[2]
            keys[:, :, :old], values[:, :, :old], positions[:old] = self.keys, self.values, self.positions
            self.keys, self.values, self.positions = keys, values, positions
        keys = self.keys.narrow(2, 0, length).unbind(0)
        values = self.values.narrow(2, 0, length).unbind(0)
        positions = self.positions.narrow(0, 0, length)
        for layer, k, v in zip(layers, keys, values):
            layer.keys, layer.values, layer.positions = k, v, positions
            layer._room = None  # its own grow/reserve copy out of the stack first
        self.views = (keys, values, positions)


@dataclass
class KVCache:
    layers: list[LayerKV | None] = field(default_factory=list)
    # every layer over one set of buffers, once a decode step has grown them together (grow); None before, or
    # False once a layer was replaced or grown on its own (each layer grows by itself from then on)
    _stack: "_Stack | None | bool" = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def empty(cls, num_layers: int) -> "KVCache":
        return cls(layers=[None] * num_layers)

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> LayerKV:
        """Append new tokens to a layer and return the layer's whole KV."""
        current = self.layers[layer]
        if current is None:
            current = LayerKV(keys, values, positions)
            self.layers[layer] = current
        else:
            current.append(keys, values, positions)
        return current

    def grow(self, position: int, dtype: torch.dtype) -> bool:
        """Add one token at `position` to every layer at once, its keys/values (`dtype`) left for the caller to
        write at entry num_tokens - 1 of each layer, as LayerKV.grow does for one. It can when every layer shares
        one shape, dtype and positions, with no head mask: the first call copies them into one stack with room
        (what each layer's first grow would copy anyway), later ones write one position and take new views.
        False, with nothing changed, otherwise, or once a layer was replaced or grown on its own: then grow each
        layer (LayerKV.grow, reserve)."""
        stack = self._stack
        if stack is None and self.layers:
            stack = self._stack = _Stack.over(self.layers, dtype) or False
            if stack:
                stack.give(self.layers, self.layers[0].num_tokens)
        if not stack or not stack.holds(self.layers) or stack.keys.dtype != dtype:
            self._stack = False
            return False
        length = self.layers[0].num_tokens
        stack.give(self.layers, length + 1)
        stack.positions[length] = position  # the layers' positions view shares it
        return True

    def layer_stride(self) -> int | None:
        """Elements from one layer's keys (and values) to the next layer's, while every layer lies in the one
        stack grow keeps them in (no head masks: one row record can serve every layer, avx2.row), else None."""
        stack = self._stack
        return stack.keys.stride(0) if stack and stack.holds(self.layers) else None

    def num_tokens(self, layer: int = 0) -> int:
        current = self.layers[layer]
        return 0 if current is None else current.num_tokens

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers if layer is not None)

    def next_position(self) -> int:
        return max(int(layer.positions.max()) + 1 for layer in self.layers if layer is not None and layer.num_tokens)

    def to_chunk(self, token_ids: list[int]) -> ChunkKV:
        """The cache as one ChunkKV ([layers, kv_heads, T, D]); every layer must hold the same T tokens."""
        keys = torch.stack([layer.keys for layer in self.layers])
        values = torch.stack([layer.values for layer in self.layers])
        return ChunkKV(keys=keys, values=values, token_ids=list(token_ids))

    @classmethod
    def from_chunk(cls, kv, device=None, dtype=None) -> "KVCache":
        """A cache holding one ChunkKV ([layers, kv_heads, T, D]) at positions 0..T-1."""
        keys, values = kv.keys.to(device, dtype), kv.values.to(device, dtype)
        positions = torch.arange(keys.shape[2], device=keys.device)
        return cls([LayerKV(keys[i], values[i], positions) for i in range(keys.shape[0])])
