"""Physically removing evicted slots from a LayerKV, and StreamingLLM-style position compaction.

Kept tokens keep their logical positions and their keys are not re-rotated: a
key was rotated for its own position at prefill, and RoPE attention depends on
the query-key distance only, so the kept keys still give exactly the scores
they had over the full cache (the kept set's attention is the full attention
renormalized — what the L1 bound measures). Re-rotating them to "close the
gaps" would change those distances and so the attention itself.

The exception is `compact_positions` (streaming only, decode time): when a
stream runs far beyond its window, the distance from the newest query to the
sinks grows without bound and leaves the range the model was trained on. It
re-rotates the kept keys so they sit on consecutive positions ending right
before the next query (StreamingLLM's "positions within the cache"), so every
query-key distance stays below the cache size. Positions only move forward and
keep their order, so the decode loop's own position counter stays valid.
"""

from __future__ import annotations

import torch

from workers.cache import LayerKV
from workers.rope import rerotate_keys


def compaction_index(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keep: [Hkv, T] bool -> (idx [Hkv, L], valid [Hkv, L]), L = max kept per head.

    Row h lists head h's kept slots in slot order, padded (valid False) to L.
    """
    heads, slots = keep.shape
    counts = keep.sum(dim=1)  # [Hkv]
    length = int(counts.max()) if heads else 0
    order_key = (~keep).long() * slots + torch.arange(slots, device=keep.device)[None, :]  # kept first, in order
    idx = torch.argsort(order_key, dim=1)[:, :length]  # [Hkv, L]
    valid = torch.arange(length, device=keep.device)[None, :] < counts[:, None]
    return idx, valid


def gather_slots(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x: [Hkv, T, ...] -> [Hkv, L, ...] with idx: [Hkv, L]."""
    index = idx.reshape(*idx.shape, *([1] * (x.dim() - 2))).expand(*idx.shape, *x.shape[2:])
    return torch.gather(x, 1, index)


def is_uniform(keep: torch.Tensor) -> bool:
    """keep: [Hkv, T] -> every head keeps the same slots."""
    return bool((keep == keep[:1]).all())


def keep_slots(kv: LayerKV, keep: torch.Tensor) -> tuple[LayerKV, torch.Tensor, torch.Tensor]:
    """Drop the slots not in `keep` ([Hkv, T] bool); the tensors really shrink.

    Returns (new LayerKV, idx [Hkv, L], valid [Hkv, L]) so per-slot state can follow.
    When all heads keep the same slots of a shared layout, the layer stays shared
    ([T] positions, no head_mask); otherwise each head is compacted on its own
    (positions [Hkv, L], head_mask marks padding): memory = the longest head.
    """
    idx, valid = compaction_index(keep)
    if kv.positions.dim() == 1 and kv.head_mask is None and is_uniform(keep):
        slots = idx[0]
        return LayerKV(kv.keys[:, slots].contiguous(), kv.values[:, slots].contiguous(),
                       kv.positions[slots].contiguous()), idx, valid
    positions = kv.head_positions()
    vmask = valid[..., None]
    keys = gather_slots(kv.keys, idx) * vmask
    values = gather_slots(kv.values, idx) * vmask
    new_positions = gather_slots(positions, idx).masked_fill(~valid, 0)
    return LayerKV(keys, values, new_positions, head_mask=valid.clone()), idx, valid


def pack_heads(kv: LayerKV) -> LayerKV:
    """A padded per-head layer -> the packed layout (workers/cache.py): only the kept entries, head-major,
    keys/values [1, N, D], positions [N], head_mask [Hkv, N] = each entry's kv head. Bytes = the entries
    kept, not Hkv x the longest head. Other layers (shared, no padding, one kv head, already packed) are
    returned as is: without padding, packing saves nothing and only widens the attention."""
    if kv.head_mask is None or kv.packed or kv.keys.shape[0] == 1 or bool(kv.head_mask.all()):
        return kv
    heads = kv.keys.shape[0]
    head, slot = kv.head_mask.nonzero(as_tuple=True)  # [N] each, head-major and in slot order
    owner = torch.zeros(heads, head.numel(), dtype=torch.bool, device=kv.keys.device)
    owner[head, torch.arange(head.numel(), device=kv.keys.device)] = True
    return LayerKV(kv.keys[head, slot][None], kv.values[head, slot][None], kv.head_positions()[head, slot],
                   head_mask=owner)


def unpack_heads(kv: LayerKV) -> LayerKV:
    """A packed layer -> the padded per-head layout (each head's entries compacted in order); others as is."""
    if not kv.packed:
        return kv
    heads = kv.kv_heads
    spread = LayerKV(kv.keys.expand(heads, -1, -1), kv.values.expand(heads, -1, -1), kv.head_positions(),
                     head_mask=kv.head_mask)
    return keep_slots(spread, kv.head_mask)[0]


def compact_positions(kv: LayerKV, inv_freq: torch.Tensor) -> LayerKV:
    """Shared-layout layer: move the kept tokens onto consecutive positions ending at max(positions).

    Each key is re-rotated by its (non-negative) shift, so relative order is unchanged and the
    newest token does not move.
    """
    if kv.positions.dim() != 1 or kv.num_tokens == 0:
        return kv
    end = int(kv.positions.max())
    new_positions = torch.arange(end - kv.num_tokens + 1, end + 1, device=kv.positions.device)
    delta = new_positions - kv.positions
    if not bool((delta != 0).any()):
        return kv
    keys = rerotate_keys(kv.keys, delta, inv_freq)
    return LayerKV(keys, kv.values, new_positions, kv.head_mask)
