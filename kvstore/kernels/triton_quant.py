"""Triton kernels for group quantization, bit packing and dequantize(+RoPE re-rotation).

Imported lazily by kvstore.kernels.dispatch only. Layouts are those of
kvstore/codecs/quant.py; kvstore/kernels/reference.py is the spec these match.
Every launcher takes [LH, T, D] views (the dispatch flattens leading axes).

Codes are quant.pack_bits streams, D*BITS/8 bytes per row. For BITS dividing 8 a
byte holds whole codes (PACK = 8 // BITS of them); for 3 bits (STREAM) byte p holds
stream bits [8p, 8p+8), so the packer gathers each of its 8 bits from code
(8p + k) // BITS, and the unpacker reads a code from the two bytes it may straddle.

Bit-exactness of quantize: the only float ops are sub, IEEE division (tl.div_rn)
and fp32 -> fp16 casts (round to nearest even), and round-half-to-even is done
with floor arithmetic (`_round_half_even`), so codes and scales equal torch's
on any backend. Dequantize may contract mul+add into an FMA: compared with a
tolerance.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ELEMS = 4096  # elements per program tile


@triton.jit
def _round_half_even(x):
    f = tl.floor(x)
    frac = x - f
    odd = f - 2.0 * tl.floor(f * 0.5)
    return tl.where(frac > 0.5, f + 1.0, tl.where(frac < 0.5, f, f + odd))


@triton.jit
def _stats_token_kernel(x_ptr, scale_ptr, zero_ptr, R, D, NG, G,
                        QMAX: tl.constexpr, SYM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr):
    # x: [R, D] rows; group g of row r = x[r, g*G : min((g+1)*G, D)] -> scale/zero [R, NG]
    pid_r = tl.program_id(0)
    g = tl.program_id(1)
    r1 = (pid_r * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # [BR]
    r = r1[:, None]  # [BR, 1]
    j = tl.arange(0, BLOCK_G)[None, :]  # [1, BG]
    d = g * G + j
    mask = (r < R) & (j < G) & (d < D)
    x = tl.load(x_ptr + r * D + d, mask=mask, other=0.0).to(tl.float32)
    rmask = r1 < R
    out = r1 * NG + g
    if SYM:
        absmax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1)
        tl.store(scale_ptr + out, tl.div_rn(absmax, QMAX * 1.0).to(tl.float16), mask=rmask)
    else:
        lo = tl.min(tl.where(mask, x, float("inf")), axis=1)
        hi = tl.max(tl.where(mask, x, float("-inf")), axis=1)
        tl.store(zero_ptr + out, lo.to(tl.float16), mask=rmask)
        tl.store(scale_ptr + out, tl.div_rn(hi - lo, QMAX * 1.0).to(tl.float16), mask=rmask)


@triton.jit
def _stats_channel_kernel(x_ptr, scale_ptr, zero_ptr, T, D, NG, G,
                          QMAX: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    # x: [LH, T, D]; group g of channel d = x[lh, g*G : min((g+1)*G, T), d] -> scale/zero [LH, D, NG]
    lh = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    lo = tl.full((BLOCK_D,), float("inf"), tl.float32)
    hi = tl.full((BLOCK_D,), float("-inf"), tl.float32)
    for i0 in range(0, G, BLOCK_T):
        i = i0 + tl.arange(0, BLOCK_T)
        t = g * G + i
        mask = ((i < G) & (t < T))[:, None] & (d < D)[None, :]
        x = tl.load(x_ptr + (lh * T + t[:, None]) * D + d[None, :], mask=mask, other=0.0).to(tl.float32)
        lo = tl.minimum(lo, tl.min(tl.where(mask, x, float("inf")), axis=0))
        hi = tl.maximum(hi, tl.max(tl.where(mask, x, float("-inf")), axis=0))
    out = (lh * D + d) * NG + g
    tl.store(zero_ptr + out, lo.to(tl.float16), mask=d < D)
    tl.store(scale_ptr + out, tl.div_rn(hi - lo, QMAX * 1.0).to(tl.float16), mask=d < D)


@triton.jit
def _scale_offset(r, d, T, D, NG, G, PER_CHANNEL: tl.constexpr):
    """Index into scale/zero of element (row r = lh*T + t, channel d)."""
    if PER_CHANNEL:
        off = ((r // T) * D + d) * NG + (r % T) // G
    else:
        off = r * NG + d // G
    return off


@triton.jit
def _quantize_at(x_ptr, scale_ptr, zero_ptr, r, d, mask, T, D, NG, G, BITS: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """Asymmetric code (int32 in [0, 2^BITS)) of element (row r, channel d)."""
    QMAX: tl.constexpr = (1 << BITS) - 1
    x = tl.load(x_ptr + r * D + d, mask=mask, other=0.0).to(tl.float32)
    soff = _scale_offset(r, d, T, D, NG, G, PER_CHANNEL)
    scale = tl.load(scale_ptr + soff, mask=mask, other=1.0).to(tl.float32)
    safe = tl.where(scale > 0, scale, 1.0)
    zero = tl.load(zero_ptr + soff, mask=mask, other=0.0).to(tl.float32)
    q = tl.minimum(tl.maximum(_round_half_even(tl.div_rn(x - zero, safe)), 0.0), QMAX * 1.0)
    return tl.where(scale > 0, q, 0.0).to(tl.int32)


@triton.jit
def _quant_pack_kernel(x_ptr, scale_ptr, zero_ptr, codes_ptr, R, T, D, NG, G,
                       BITS: tl.constexpr, SYM: tl.constexpr, PER_CHANNEL: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
    # x: [R, D] -> codes [R, P], P = D * BITS / 8 bytes per row, a little-endian bit stream
    STREAM: tl.constexpr = 8 % BITS != 0
    PACK: tl.constexpr = 8 if STREAM else 8 // BITS  # third axis: bits of a byte (STREAM) or codes of a byte
    P = D * BITS // 8
    pid = tl.program_id(0)
    r2 = (pid * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]  # [BR, 1]
    p2 = tl.arange(0, BLOCK_P)[None, :]  # [1, BP]
    r = r2[:, :, None]  # [BR, 1, 1]
    p = p2[:, :, None]  # [1, BP, 1]
    k = tl.arange(0, PACK)[None, None, :]  # [1, 1, PACK]
    mask = (r < R) & (p < P)
    out_mask = (r2 < R) & (p2 < P)
    if SYM:
        d = p * PACK + k  # PACK == 1: d == p
        x = tl.load(x_ptr + r * D + d, mask=mask, other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr + _scale_offset(r, d, T, D, NG, G, PER_CHANNEL), mask=mask, other=1.0)
        safe = tl.where(scale.to(tl.float32) > 0, scale.to(tl.float32), 1.0)
        q = tl.minimum(tl.maximum(_round_half_even(tl.div_rn(x, safe)), -127.0), 127.0)
        tl.store(codes_ptr + r * P + p, q.to(tl.int8), mask=mask)
    elif STREAM:
        s = p * 8 + k  # stream bit k of byte p: bit s % BITS of code s // BITS
        q = _quantize_at(x_ptr, scale_ptr, zero_ptr, r, s // BITS, mask, T, D, NG, G, BITS, PER_CHANNEL)
        byte = tl.sum(((q >> (s % BITS)) & 1) << k, axis=2)  # disjoint bits: sum == or
        tl.store(codes_ptr + r2 * P + p2, byte.to(tl.uint8), mask=out_mask)
    else:
        q = _quantize_at(x_ptr, scale_ptr, zero_ptr, r, p * PACK + k, mask, T, D, NG, G, BITS, PER_CHANNEL)
        byte = tl.sum(q << (k * BITS), axis=2)  # disjoint bit fields: sum == or
        tl.store(codes_ptr + r2 * P + p2, byte.to(tl.uint8), mask=out_mask)


@triton.jit
def _load_value(codes_ptr, scale_ptr, zero_ptr, r, d, mask, T, D, NG, G,
                BITS: tl.constexpr, SYM: tl.constexpr, PER_CHANNEL: tl.constexpr, RAW: tl.constexpr):
    """fp32 value of element (r, d): dequantized from codes, or loaded as is (RAW)."""
    STREAM: tl.constexpr = 8 % BITS != 0
    if RAW:
        x = tl.load(codes_ptr + r * D + d, mask=mask, other=0.0).to(tl.float32)
    else:
        P = D * BITS // 8
        soff = _scale_offset(r, d, T, D, NG, G, PER_CHANNEL)
        scale = tl.load(scale_ptr + soff, mask=mask, other=0.0).to(tl.float32)
        at = d * BITS  # the code's first stream bit
        byte = tl.load(codes_ptr + r * P + at // 8, mask=mask, other=0)
        if SYM:
            x = byte.to(tl.float32) * scale
        else:
            word = byte.to(tl.int32)
            if STREAM:  # the code may run into the next byte
                nxt = tl.load(codes_ptr + r * P + at // 8 + 1, mask=mask & (at // 8 + 1 < P), other=0)
                word = word | (nxt.to(tl.int32) << 8)
            q = (word >> (at % 8)) & ((1 << BITS) - 1)
            zero = tl.load(zero_ptr + soff, mask=mask, other=0.0).to(tl.float32)
            x = q.to(tl.float32) * scale + zero
    return x


@triton.jit
def _dequant_kernel(codes_ptr, scale_ptr, zero_ptr, out_ptr, delta_ptr, inv_freq_ptr, delta, R, T, D, NG, G,
                    BITS: tl.constexpr, SYM: tl.constexpr, PER_CHANNEL: tl.constexpr, RAW: tl.constexpr,
                    ROTATE: tl.constexpr, DELTA_PER_TOKEN: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # codes [R, D/PACK] (+ scale/zero) -> out [R, D]; ROTATE: out = x*cos + rotate_half(x)*sin at angle delta*f
    pid = tl.program_id(0)
    r = (pid * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]  # [BR, 1]
    d = tl.arange(0, BLOCK_D)[None, :]  # [1, BD]
    mask = (r < R) & (d < D)
    x = _load_value(codes_ptr, scale_ptr, zero_ptr, r, d, mask, T, D, NG, G, BITS, SYM, PER_CHANNEL, RAW)
    if ROTATE:
        half = D // 2
        first = d < half
        partner = tl.where(first, d + half, d - half)
        xp = _load_value(codes_ptr, scale_ptr, zero_ptr, r, partner, mask, T, D, NG, G, BITS, SYM, PER_CHANNEL, RAW)
        if DELTA_PER_TOKEN:
            pos = tl.load(delta_ptr + r % T, mask=r < R, other=0.0)
        else:
            pos = delta
        freq = tl.load(inv_freq_ptr + d % half, mask=d < D, other=0.0)
        angle = pos * freq
        rot = tl.where(first, -xp, xp)
        x = x * tl.cos(angle) + rot * tl.sin(angle)
    tl.store(out_ptr + r * D + d, x.to(out_ptr.dtype.element_ty), mask=mask)


# -- launchers: x/codes are contiguous [LH, T, D(/PACK)] -------------------------------------


def _block_r(rows_elems: int) -> int:
    return max(1, _ELEMS // triton.next_power_of_2(max(rows_elems, 1)))


def quantize(x: torch.Tensor, bits: int, group_size: int, symmetric: bool, per_channel: bool):
    """x [LH, T, D] -> codes [LH, T, D*bits/8], scale, zero (token: [LH, T, NG]; channel: [LH, D, NG])."""
    lh, t, d = x.shape
    x = x.contiguous()
    if per_channel:
        ng = -(-t // group_size)
        scale = torch.empty(lh, d, ng, dtype=torch.float16, device=x.device)
    else:
        ng = -(-d // group_size)
        scale = torch.empty(lh, t, ng, dtype=torch.float16, device=x.device)
    zero = None if symmetric else torch.empty_like(scale)
    per_byte = 8 if 8 % bits else 8 // bits  # the pack kernel's third axis (stream bits, or codes)
    codes = torch.empty(lh, t, d * bits // 8, dtype=torch.int8 if symmetric else torch.uint8, device=x.device)
    rows = lh * t
    if x.numel() == 0:
        return codes, scale, zero
    zero_arg = scale if zero is None else zero  # unused when symmetric
    if per_channel:
        block_d = triton.next_power_of_2(d)
        block_t = min(triton.next_power_of_2(group_size), max(1, _ELEMS // block_d))
        _stats_channel_kernel[(lh, ng)](x, scale, zero_arg, t, d, ng, group_size,
                                        QMAX=(1 << bits) - 1, BLOCK_T=block_t, BLOCK_D=block_d)
    else:
        block_g = triton.next_power_of_2(min(group_size, d))
        block_r = _block_r(block_g)
        _stats_token_kernel[(triton.cdiv(rows, block_r), ng)](
            x, scale, zero_arg, rows, d, ng, group_size,
            QMAX=127 if symmetric else (1 << bits) - 1, SYM=symmetric, BLOCK_R=block_r, BLOCK_G=block_g)
    block_p = triton.next_power_of_2(d * bits // 8)
    block_r = _block_r(block_p * per_byte)
    _quant_pack_kernel[(triton.cdiv(rows, block_r),)](
        x, scale, zero_arg, codes, rows, t, d, ng, group_size,
        BITS=bits, SYM=symmetric, PER_CHANNEL=per_channel, BLOCK_R=block_r, BLOCK_P=block_p)
    return codes, scale, zero


def dequantize(codes: torch.Tensor | None, scale, zero, bits: int, group_size: int, head_dim: int, *,
               symmetric: bool = False, per_channel: bool = False, raw: torch.Tensor | None = None,
               delta=None, inv_freq=None, out_dtype=torch.float32) -> torch.Tensor:
    """codes [LH, T, D*bits/8] (or raw fp values [LH, T, D]) -> [LH, T, D] out_dtype, re-rotated by delta if given."""
    src = (raw if raw is not None else codes).contiguous()
    lh, t = src.shape[:2]
    d = head_dim
    out = torch.empty(lh, t, d, dtype=out_dtype, device=src.device)
    rows = lh * t
    if out.numel() == 0:
        return out
    scale = src if scale is None else scale.contiguous()
    zero = scale if zero is None else zero.contiguous()
    ng = scale.shape[-1] if raw is None else 1
    rotate = delta is not None
    per_token = rotate and torch.is_tensor(delta) and delta.dim() > 0
    delta_t = delta.to(src.device, torch.float32).contiguous() if per_token else src
    delta_s = 0.0 if (not rotate or per_token) else float(delta)
    freq = inv_freq.to(src.device, torch.float32).contiguous() if rotate else src
    block_d = triton.next_power_of_2(d)
    block_r = _block_r(block_d)
    _dequant_kernel[(triton.cdiv(rows, block_r),)](
        src, scale, zero, out, delta_t, freq, delta_s, rows, t, d, ng, group_size,
        BITS=bits, SYM=symmetric, PER_CHANNEL=per_channel, RAW=raw is not None, ROTATE=rotate,
        DELTA_PER_TOKEN=per_token, BLOCK_R=block_r, BLOCK_D=block_d)
    return out
