"""RoPE in C (rotary.c): the library, and a pass's queries or keys rotated at their positions in one call.

A prefill rotates every layer's queries and keys: torch gathered the positions' cos and sin rows, then ran four
ops over the halves, writing a new [H, S, D] tensor from the projection's [S, H, D] rows. `rotate_rows` reads
each row once, looks its cos and sin up in the runner's position tables and writes [H, S, D]: the same values,
bit for bit on the box it was measured on (the same product, then fused multiply-add, as apply_rope's torch
ops; tests/workers/test_rotary.py holds it within 2e-6).

    library()                                  the compiled passes, or None (why: unavailable())
    rows_fit(x, cos)                           can rotate_rows take these tensors
    rotate_rows(x, positions, cos, sin)        x [S, H, D] (last dim contiguous); cos/sin [P, D] -> [H, S, D]

workers/placement.py uses the same library for a stored chunk's placement.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from workers import native

SOURCE = Path(__file__).with_name("rotary.c")


@functools.cache
def library() -> ctypes.CDLL | None:
    lib, _ = native.load(SOURCE)
    if lib is not None:
        lib.ragkv_place.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + [ctypes.c_void_p] * 2 + \
            [ctypes.c_long] * 2 + [ctypes.c_void_p] * 2 + [ctypes.c_long] * 2
        lib.ragkv_place.restype = None
        lib.ragkv_rotate_rows.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.ragkv_rotate_rows.restype = None
    return lib


def unavailable() -> str | None:
    """Why the C passes cannot run on this machine, or None when they can."""
    return native.load(SOURCE)[1]


def rows_fit(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """fp32 rows [S, H, D] on a CPU with a contiguous last dim and heads side by side, a head size that is a
    multiple of 16, fp32 tables of that width, and the library built."""
    return (x.dim() == 3 and x.dtype == torch.float32 and cos.dtype == torch.float32 and x.device.type == "cpu"
            and x.shape[2] % 16 == 0 and x.stride(2) == 1 and x.stride(1) == x.shape[2]
            and cos.shape[-1] == x.shape[2] and library() is not None)


def rotate_rows(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [S, H, D] rotated at positions [S] with cos/sin [P, D] (P above every position) -> [H, S, D] fp32."""
    seq, heads, dim = x.shape
    positions = positions.to(torch.int64).contiguous()
    if seq and not 0 <= int(positions.min()) <= int(positions.max()) < cos.shape[0]:
        raise ValueError(f"positions {int(positions.min())}..{int(positions.max())} outside a table of {cos.shape[0]}")
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(heads, seq, dim)
    library().ragkv_rotate_rows(x.data_ptr(), x.stride(0), seq, heads, dim, positions.data_ptr(), cos.data_ptr(),
                                sin.data_ptr(), out.data_ptr())
    return out
