"""Placing a stored chunk into a prompt's cache: its slot's context drift, the rotation to its place and the
copy, in one pass (rotary.c: ragkv_place) instead of three (a shifted copy, a rotated copy, the write into the cache).

    place(keys, values, start, chunk, inv_freq, drift=None, slot=1)
        keys/values: the prompt's cache buffers [L, H, P, D]; the chunk's T entries go to start..start+T-1,
        keys rotated there (kvstore.ChunkKV.keys_at), both shifted first by the drift of `slot` when given
        (workers/context_drift.drifted). The chunk is never written.

The C pass takes fp32 chunks and buffers on a CPU where the library built, with a head size that is a
multiple of 16, and a drift only over pre-RoPE keys (the default codec's); anything else (CUDA: Triton's
rotation, half precision, post-RoPE keys with a drift) takes the torch path, which computes the same values
(bit for bit on the CPU: tests/workers/test_placement.py). A compressed chunk (kept entries only) is placed
by blend.place_chunk.
"""

from __future__ import annotations

import torch

from kvstore.kv import ChunkKV
from kvstore.rope import rope_cos_sin
from workers import rotary
from workers.context_drift import ContextDrift, drifted


def place(keys: torch.Tensor, values: torch.Tensor, start: int, chunk: ChunkKV, inv_freq: torch.Tensor | None,
          drift: ContextDrift | None = None, slot: int = 1) -> None:
    """Write `chunk` into keys/values [L, H, P, D] at start..start+T-1 (module docstring)."""
    if not 0 <= start <= keys.shape[2] - chunk.num_tokens or keys.shape[:2] != chunk.keys.shape[:2]:
        raise ValueError(f"a chunk of {chunk.num_tokens} tokens over {tuple(chunk.keys.shape[:2])} layers and heads "
                         f"does not fit cache buffers {tuple(keys.shape)} at {start}")
    if runs_native(keys, values, chunk, drift):
        return _place_native(keys, values, start, chunk, inv_freq, drift, slot)
    if drift is not None:
        chunk = drifted(chunk, slot, drift, inv_freq)
    end = start + chunk.num_tokens
    keys[:, :, start:end] = chunk.keys_at(start, inv_freq, keys.dtype, keys.device)
    values[:, :, start:end] = chunk.values  # copy_ converts dtype and device in the same pass


def runs_native(keys: torch.Tensor, values: torch.Tensor, chunk: ChunkKV, drift: ContextDrift | None) -> bool:
    """Does `place` take the C pass for these buffers and this chunk (else the torch path)?"""
    tensors = (keys, values, chunk.keys, chunk.values)
    return (chunk.positions is None and (drift is None or chunk.pre_rope)
            and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
            and keys.shape[-1] % 16 == 0 and keys.stride() == values.stride() and keys.stride()[2:] == (keys.shape[3], 1)
            and rotary.library() is not None)


def _place_native(keys, values, start, chunk, inv_freq, drift, slot) -> None:
    freq = chunk.inv_freq if chunk.inv_freq is not None else inv_freq
    if freq is None and (chunk.pre_rope or start):
        raise ValueError("placing keys at an offset needs inv_freq")
    count, dim = chunk.num_tokens, keys.shape[3]
    if chunk.pre_rope:  # rotated at start + slot position: one angle per token
        cos, sin = rope_cos_sin(torch.arange(start, start + count), freq)  # [T, D] or [L, 1, T, D]
        token = dim
    else:  # rotated at 0..T-1 already: moved by `start`, one angle for all (start 0: cos 1, sin 0, exact)
        cos, sin = rope_cos_sin(torch.tensor([start]), freq) if freq is not None else _identity(dim)
        token = 0
    layer = 0 if cos.dim() == 2 else cos[0].numel()  # per-layer frequencies (Gemma 3): one table a layer
    cos, sin = cos.contiguous(), sin.contiguous()
    num_layers, num_heads = keys.shape[:2]
    if cos.shape[-1] != dim or (layer and cos.shape[0] != num_layers):  # the C pass reads whole tables
        raise ValueError(f"RoPE frequencies {tuple(freq.shape)} do not fit keys of {num_layers} layers x {dim}")
    dk = dv = None
    if drift is not None:  # [L, H, D] of the chunk's slot, pre-RoPE
        dk, dv = drift.keys[slot].float().contiguous(), drift.values[slot].float().contiguous()
        if dk.shape != (num_layers, num_heads, dim) or dv.shape != dk.shape:
            raise ValueError(f"a context drift of {tuple(dk.shape)} does not fit keys {tuple(keys.shape)}")
    src_k, src_v = chunk.keys.contiguous(), chunk.values.contiguous()
    out_k, out_v = keys[:, :, start:], values[:, :, start:]
    rotary.library().ragkv_place(src_k.data_ptr(), src_v.data_ptr(), _ptr(dk), _ptr(dv), num_layers, num_heads,
                                 count, dim, cos.data_ptr(), sin.data_ptr(), layer, token, out_k.data_ptr(),
                                 out_v.data_ptr(), keys.stride(0), keys.stride(1))


def _identity(dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(1, dim), torch.zeros(1, dim)


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()
