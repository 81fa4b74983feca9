"""Torch reference for every kernel op: the specification the Triton kernels must match.

Built only from kvstore.codecs.quant (the packed layouts) and kvstore.rope (the
re-rotation), so a block written by a kernel is read by the codecs and back.
Shapes: x [..., T, D]; codes [..., T, D * bits / 8] packed along D, low bits first.

- token ops: groups of `group_size` channels along D, scale/zero [..., T, ceil(D/G)]
  (int8: bits 8, G = D, optionally symmetric; int4: bits 4; KIVI-layout values: bits 2, 3 or 4).
- channel ops: groups of `group_size` tokens along T, scale/zero [..., D, ceil(T/G)]
  (KIVI-layout keys: bits 2, 3 or 4).
Bit widths: quant.PACK_BITS (2, 3, 4, 8); codes are quant.pack_bits streams.
- `delta` (int or [T]) with `inv_freq` [D/2]: the dequantized keys are re-rotated by
  delta (kvstore.rope.rerotate_keys) before the cast to `out_dtype`.
"""

from __future__ import annotations

import torch

from kvstore import rope
from kvstore.codecs import quant


def check_bits(bits: int, symmetric: bool = False) -> None:
    if bits not in quant.PACK_BITS:
        raise ValueError(f"bits must be one of {quant.PACK_BITS}, got {bits}")
    if symmetric and bits != 8:
        raise ValueError("symmetric quantization is int8 only")


def _rotate(x: torch.Tensor, delta, inv_freq) -> torch.Tensor:
    if delta is None:
        return x
    if inv_freq is None:
        raise ValueError("re-rotation needs inv_freq")
    return rope.rerotate_keys(x, delta, inv_freq)


def quantize_token(x: torch.Tensor, bits: int, group_size: int, symmetric: bool = False):
    """x [..., T, D] -> codes [..., T, D*bits/8], scale [..., T, NG] fp16, zero (same, or None if symmetric)."""
    check_bits(bits, symmetric)
    if symmetric:
        q, scale = quant.quantize_sym(x, bits)
        return q, scale, None
    q, scale, zero = quant.quantize_asym(x, bits, group_size)
    return quant.pack_bits(q, bits), scale, zero


def dequantize_token(codes, scale, zero, bits: int, group_size: int, *, symmetric: bool = False,
                     delta=None, inv_freq=None, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of quantize_token (+ optional re-rotation) -> [..., T, D] out_dtype."""
    check_bits(bits, symmetric)
    if symmetric:
        x = quant.dequantize_sym(codes, scale)
    else:
        x = quant.dequantize_asym(quant.unpack_bits(codes, bits), scale, zero, group_size)
    return _rotate(x, delta, inv_freq).to(out_dtype)


def quantize_channel(x: torch.Tensor, bits: int, group_size: int):
    """x [..., T, D] -> codes [..., T, D*bits/8], scale/zero [..., D, ceil(T/G)] fp16."""
    check_bits(bits)
    q, scale, zero = quant.quantize_per_channel(x, bits, group_size)
    return quant.pack_bits(q, bits), scale, zero


def dequantize_channel(codes, scale, zero, bits: int, group_size: int, *, delta=None, inv_freq=None,
                       out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of quantize_channel (+ optional re-rotation) -> [..., T, D] out_dtype."""
    check_bits(bits)
    x = quant.dequantize_per_channel(quant.unpack_bits(codes, bits), scale, zero, group_size)
    return _rotate(x, delta, inv_freq).to(out_dtype)


def rerotate_keys(keys: torch.Tensor, delta, inv_freq: torch.Tensor, out_dtype: torch.dtype | None = None):
    """keys [..., T, D] at positions p -> at p + delta, cast to out_dtype (default: keys.dtype)."""
    return _rotate(keys, delta, inv_freq).to(out_dtype or keys.dtype)
