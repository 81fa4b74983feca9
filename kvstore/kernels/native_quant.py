"""The CPU's C kernels for a block's codes (kvstore/kernels/dequant.c): unpacked and scaled in one pass each, value
for value what reference.dequantize_token / dequantize_channel compute (tested), where torch took a shift and a
mask per code of a byte, a stack, a float copy, a multiply and an add: a default-model chunk of 128 tokens
(`wk4v3`) spent ~5 ms decoding (docs/benchmarks.md, twelfth session).

    unavailable()                                          why the kernels cannot run here, or None
    fits(codes, group_size, per_channel)                   can they take these codes (CPU, contiguous, a width)
    dequantize(codes, scale, zero, bits, group_size, per_channel) -> fp32 [..., T, D]
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import torch

from kvstore import native
from kvstore.codecs import quant

SOURCE = Path(__file__).with_name("dequant.c")


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib, _ = native.load(SOURCE)
    if lib is not None:
        lib.ragkv_dequant_token.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] + [ctypes.c_int] * 3 + [
            ctypes.c_void_p]
        lib.ragkv_dequant_token.restype = None
        lib.ragkv_dequant_channel.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] + [ctypes.c_int] * 4 + [
            ctypes.c_void_p]
        lib.ragkv_dequant_channel.restype = None
    return lib


def unavailable() -> str | None:
    """Why the kernels cannot run on this machine, or None when they can."""
    return native.load(SOURCE)[1]


def fits(codes: torch.Tensor, group_size: int, per_channel: bool) -> bool:
    """Non-empty CPU codes (any layout: `dequantize` makes them contiguous) and, per token, groups of whole 8-code runs,
    on a machine where the kernels built. The width is `dequantize`'s check."""
    return (codes.device.type == "cpu" and codes.dim() >= 2 and codes.numel() > 0
            and (per_channel or group_size % 8 == 0) and _library() is not None)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int, group_size: int,
               per_channel: bool) -> torch.Tensor:
    """codes [..., T, D * bits / 8] uint8; scale/zero fp16 [..., T, ceil(D / G)] (per token) or [..., D, ceil(T / G)]
    (per channel) -> [..., T, D] fp32."""
    if bits not in quant.PACK_BITS:
        raise ValueError(f"bits must be one of {quant.PACK_BITS}, got {bits}")
    *lead, tokens, width = codes.shape
    dim = width * 8 // bits
    codes, scale, zero = codes.contiguous(), scale.half().contiguous(), zero.half().contiguous()
    out = torch.empty(*lead, tokens, dim)
    rows = math.prod(lead)  # the leading axes' entries: [rows, T, width]
    if per_channel:
        _library().ragkv_dequant_channel(codes.data_ptr(), scale.data_ptr(), zero.data_ptr(), rows, tokens, dim, bits,
                                         group_size, out.data_ptr())
    else:
        _library().ragkv_dequant_token(codes.data_ptr(), scale.data_ptr(), zero.data_ptr(), rows * tokens, dim, bits,
                                       group_size, out.data_ptr())
    return out
