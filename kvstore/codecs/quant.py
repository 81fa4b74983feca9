"""Quantization and bit-packing math, as plain torch functions.

Every codec is built from these, and the Triton kernels must reproduce the
packed layouts byte for byte, so the layouts are spelled out here:

- Group quantization runs along the LAST axis of its input. The axis is cut
  into groups of `group_size` consecutive elements; a last, shorter group
  gets its own scale/zero computed over its own elements only (no padding
  enters the statistics). Scales/zeros: [..., ceil(N / group_size)], fp16.
- Asymmetric: zero = min(group) (stored fp16), scale = (max - min) / (2^bits - 1)
  (stored fp16), q = clamp(round((x - zero) / scale), 0, 2^bits - 1),
  x_hat = q * scale + zero. Quantization divides by the *fp16-rounded*
  scale/zero, so what the decoder sees is exactly what the encoder used.
  A constant group (max == min) stores scale 0 and q = 0.
- Symmetric (int8 only): scale = absmax / 127, q = clamp(round(x / scale), -127, 127).
- Packing runs along the last axis too, as a little-endian bit stream (pack_bits):
  4 bit:  byte = q[2i]   | q[2i+1] << 4
  2 bit:  byte = q[4i]   | q[4i+1] << 2 | q[4i+2] << 4 | q[4i+3] << 6
  3 bit:  8 codes in 3 bytes, code i at stream bits [3i, 3i+3) (it may straddle two bytes)
  The last axis must fill whole bytes: a multiple of 2 (4 bit), 4 (2 bit) or 8 (3 bit).

Only integer/float torch ops are used (no numpy), so each line has a direct
Triton counterpart.
"""

from __future__ import annotations

import math

import torch


def num_groups(n: int, group_size: int) -> int:
    return -(-n // group_size)


def _group_reduce(x: torch.Tensor, group_size: int, op: str) -> torch.Tensor:
    """x: [..., N] -> [..., ceil(N/G)]: amin/amax per group, the last group possibly shorter."""
    n = x.shape[-1]
    full = n // group_size * group_size
    parts = []
    if full:
        g = x[..., :full].reshape(*x.shape[:-1], full // group_size, group_size)
        parts.append(g.amin(dim=-1) if op == "min" else g.amax(dim=-1))
    if full < n:
        tail = x[..., full:]
        parts.append(tail.amin(dim=-1, keepdim=True) if op == "min" else tail.amax(dim=-1, keepdim=True))
    return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]


def _expand_groups(s: torch.Tensor, group_size: int, n: int) -> torch.Tensor:
    """s: [..., ceil(N/G)] -> [..., N], each group's value repeated over its elements."""
    return s.repeat_interleave(group_size, dim=-1)[..., :n]


def quantize_asym(x: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric group quantization along the last axis.

    x: [..., N] float -> q: [..., N] uint8 in [0, 2^bits), scale, zero: [..., ceil(N/G)] fp16
    """
    if x.shape[-1] == 0:
        empty = x.new_zeros(*x.shape[:-1], 0, dtype=torch.float16)
        return x.new_zeros(x.shape, dtype=torch.uint8), empty, empty
    x = x.float()
    qmax = (1 << bits) - 1
    lo = _group_reduce(x, group_size, "min")
    hi = _group_reduce(x, group_size, "max")
    zero = lo.half()
    scale = ((hi - lo) / qmax).half()
    # Divide by what the decoder will multiply by; a zero scale (constant group) maps to q = 0.
    scale_f = _expand_groups(scale.float(), group_size, x.shape[-1])
    zero_f = _expand_groups(zero.float(), group_size, x.shape[-1])
    safe = torch.where(scale_f > 0, scale_f, torch.ones_like(scale_f))
    q = torch.round((x - zero_f) / safe).clamp_(0, qmax)
    q = torch.where(scale_f > 0, q, torch.zeros_like(q))
    return q.to(torch.uint8), scale, zero


def dequantize_asym(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """q: [..., N] uint8, scale/zero: [..., ceil(N/G)] fp16 -> [..., N] float32"""
    n = q.shape[-1]
    if n % group_size:  # a short last group: expand the parameters to the elements
        return q.float() * _expand_groups(scale.float(), group_size, n) + _expand_groups(zero.float(), group_size, n)
    x = q.reshape(*q.shape[:-1], n // group_size, group_size).to(torch.float32, copy=True)  # [..., NG, G], in place
    return x.mul_(scale.float()[..., None]).add_(zero.float()[..., None]).reshape(q.shape)


def quantize_sym(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantization, one scale per vector along the last axis.

    x: [..., N] float -> q: [..., N] int8 in [-(2^(b-1)-1), 2^(b-1)-1], scale: [..., 1] fp16
    """
    qmax = (1 << (bits - 1)) - 1
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / qmax).half()
    scale_f = scale.float()
    safe = torch.where(scale_f > 0, scale_f, torch.ones_like(scale_f))
    q = torch.round(x / safe).clamp_(-qmax, qmax)
    return q.to(torch.int8), scale


def dequantize_sym(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q: [..., N] int8, scale: [..., 1] fp16 -> [..., N] float32"""
    return q.to(torch.float32, copy=True).mul_(scale.float())


def quantize_per_channel(x: torch.Tensor, bits: int, group_size: int):
    """KV [..., tokens, head_dim]: groups of `group_size` tokens, one scale/zero per channel per group.

    -> q: [..., tokens, head_dim] uint8, scale/zero: [..., head_dim, ceil(tokens/G)] fp16
    """
    q, scale, zero = quantize_asym(x.transpose(-1, -2), bits, group_size)  # q: [..., D, T]
    return q.transpose(-1, -2).contiguous(), scale, zero


def dequantize_per_channel(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """q: [..., tokens, head_dim] uint8, scale/zero: [..., head_dim, ceil(tokens/G)] -> [..., tokens, head_dim]
    float32, contiguous: the formula of dequantize_asym (code * scale + zero), computed in place in the codes'
    own token-major layout (no transposed copies: those cost most of a decode at token counts like 131)."""
    tokens = q.shape[-2]
    full = tokens // group_size  # whole groups; a short last group (tokens % G) is scaled on its own
    x = q.to(torch.float32, memory_format=torch.contiguous_format)  # [..., T, D]
    scale, zero = scale.float().transpose(-1, -2), zero.float().transpose(-1, -2)  # [..., NG, D]
    if full:
        whole = x[..., : full * group_size, :].unflatten(-2, (full, group_size))  # [..., NG, G, D], a view of x
        whole.mul_(scale[..., :full, None, :]).add_(zero[..., :full, None, :])
    if full * group_size < tokens:
        x[..., full * group_size:, :].mul_(scale[..., full:, :]).add_(zero[..., full:, :])
    return x


def _chunking(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the smallest whole-byte run: 8 // gcd(8, bits) codes fill bits // gcd(8, bits) bytes."""
    g = math.gcd(8, bits)
    return 8 // g, bits // g


def pack_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q: [..., N] uint8 in [0, 2^bits) -> [..., N*bits/8] uint8: a little-endian bit stream.

    Element i occupies bits [i*bits, (i+1)*bits) of the stream, low bit first; N*bits must be a
    multiple of 8. For bits dividing 8 a byte holds whole codes (4 bit: q[2i] | q[2i+1] << 4); for
    3 bits, 8 codes fill 3 bytes and a code may straddle two bytes. Runs of `codes` codes are
    gathered into one integer word, then cut into `nbytes` bytes.
    """
    check_pack(q.shape[-1], bits)
    if bits == 8:
        return q
    codes, nbytes = _chunking(bits)
    lead, n = q.shape[:-1], q.shape[-1]
    word = _join(q.reshape(*lead, n // codes, codes), bits)  # [..., runs]
    return _split(word, 8, nbytes).reshape(*lead, n * bits // 8)


def unpack_bits(p: torch.Tensor, bits: int) -> torch.Tensor:
    """p: [..., N*bits/8] uint8 -> q: [..., N] uint8 (inverse of pack_bits)."""
    if bits == 8:
        return p
    lead, m = p.shape[:-1], p.shape[-1]
    if 8 % bits == 0:  # whole codes in each byte (2, 4 bit): shift and mask the bytes themselves
        mask = (1 << bits) - 1
        return torch.stack([(p >> (k * bits)) & mask for k in range(8 // bits)], dim=-1).reshape(*lead, m * 8 // bits)
    if bits == 3:  # 8 codes in 3 bytes, on the bytes themselves (the same stream as _join/_split)
        b0, b1, b2 = p.reshape(*lead, m // 3, 3).unbind(-1)
        fields = [b0 & 7, (b0 >> 3) & 7, (b0 >> 6) | ((b1 & 1) << 2), (b1 >> 1) & 7, (b1 >> 4) & 7,
                  (b1 >> 7) | ((b2 & 3) << 1), (b2 >> 2) & 7, b2 >> 5]
        return torch.stack(fields, dim=-1).reshape(*lead, m * 8 // bits)
    raise ValueError(f"bits must be one of {PACK_BITS}, got {bits}")


def _join(fields: torch.Tensor, width: int) -> torch.Tensor:
    """fields [..., K] uint8, each < 2^width -> [...] int word, field k at bits [k*width, (k+1)*width)
    (int32 while K * width fits in 31 bits, int64 beyond)."""
    fields = fields.to(torch.int32 if fields.shape[-1] * width <= 31 else torch.int64)
    word = fields[..., 0].clone()
    for k in range(1, fields.shape[-1]):
        word |= fields[..., k] << (k * width)
    return word


def _split(word: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """Inverse of _join: [...] int word -> [..., count] uint8 fields of `width` bits, lowest first."""
    mask = (1 << width) - 1
    return torch.stack([(word >> (k * width)) & mask for k in range(count)], dim=-1).to(torch.uint8)


PACK_BITS = (2, 3, 4, 8)  # widths every codec, the reference ops and the Triton kernels support


def check_pack(n: int, bits: int) -> None:
    """ValueError unless `bits` is a supported width and n codes fill whole bytes."""
    if bits not in PACK_BITS:
        raise ValueError(f"bits must be one of {PACK_BITS}, got {bits}")
    if n * bits % 8:
        raise ValueError(f"{bits}-bit packing needs the last axis divisible by {8 // math.gcd(8, bits)}, got {n}")
