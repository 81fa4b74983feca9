"""Attention of query rows over their own ranges of cached entries, in one C call (row_attention.c).

Blend recomputes ~15-50% of a prompt's rows, scattered over it, and each must attend over every cached entry
up to its own position. SDPA has no such mask: cut into query blocks (attention.query_blocks) it computes
13-15% more key-rows than the rows need, at 29-34 ns a key-row for small blocks, against ~25 for full's
causal pass. This kernel computes each row over exactly its own range, with the keys and values read once per
tile of rows, in fp32: 15-19 ns a key-row on a 2-core Zen 4 (the box's fp32 GEMM rate), ~1.45x SDPA for blend's
rows and 1.2-2x for whole prompts (docs/benchmarks.md, "tenth session"). A row's result does not depend on which
rows are computed with it (row_attention.c), so the same row of a full prefill and of a blend over the same
cache attend alike, bit for bit. On a CPU with AVX512-BF16 the same tiles run in bf16 arithmetic (`bf16=True`,
the bf16-attention prefill kernel's): operands and softmax weights in bf16, sums in fp32 by vdpbf16ps, 1.2-1.7x
the fp32 rate (docs/benchmarks.md, "twelfth session"); row invariance holds there too.

    usable(dtype, device)                         whether the kernel can run here, for these tensors
    bf16_fits(head_dim)                           whether its bf16 arithmetic can (AVX512-BF16, D % 16 == 0)
    attend_rows(q, keys, values, first, end, s,   q [Hq, S, D]; keys/values [Hkv, T, D]; row i sees entries
                bf16=False)                       [first[i], end[i]) -> [S, Hq * D]
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from workers import native

SOURCE = Path(__file__).with_name("row_attention.c")


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib, _ = native.load(SOURCE)
    if lib is not None:
        lib.ragkv_attend_rows.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_int,
                                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p]
        lib.ragkv_attend_rows.restype = None
        lib.ragkv_attend_rows_bf16.argtypes = lib.ragkv_attend_rows.argtypes
        lib.ragkv_attend_rows_bf16.restype = ctypes.c_int
    return lib


def unavailable() -> str | None:
    """Why the kernel cannot run on this machine, or None when it can."""
    return native.load(SOURCE)[1]


def usable(dtype: torch.dtype, device: torch.device | str) -> bool:
    """fp32 tensors on a CPU where the kernel built (for a head layout it `fits`; an AttentionPlan of row ranges
    runs any other under SDPA's mask of the same ranges)."""
    return dtype == torch.float32 and torch.device(device).type == "cpu" and _library() is not None


def fits(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Does the kernel take this head layout: whole query groups, and a head size that is a multiple of 8?"""
    return head_dim % 8 == 0 and num_heads % num_kv_heads == 0


@functools.cache
def bf16_fits(head_dim: int) -> bool:
    """Can the bf16 arithmetic run here, for this head size: a CPU with AVX512-BF16 and a multiple of 16?"""
    return head_dim % 16 == 0 and bool(torch.cpu._is_avx512_bf16_supported()) and _library() is not None


def attend_rows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: torch.Tensor, end: torch.Tensor,
                scale: float, bf16: bool = False) -> torch.Tensor:
    """q [Hq, S, D]; keys/values [Hkv, T, D] (CPU; read as fp32); first/end [S] int32 with first < end <= T -> the
    attention of row i over entries [first[i], end[i]) of its kv head: [S, Hq * D] fp32. Computed in fp32, or with
    `bf16` in bf16 arithmetic (operands rounded to bf16, sums in fp32; where `bf16_fits`)."""
    num_heads, seq, dim = q.shape
    if not fits(num_heads, keys.shape[0], dim):
        raise ValueError(f"row attention needs a head size that is a multiple of 8 and whole query groups "
                         f"(got {num_heads} heads of {dim} over {keys.shape[0]})")
    if bf16 and not bf16_fits(dim):
        raise ValueError(f"bf16 row attention needs AVX512-BF16 and a head size that is a multiple of 16 (got {dim})")
    q = q.float().contiguous()
    keys, values = _rows_of(keys.float()), _rows_of(values.float())
    out = torch.empty(seq, num_heads * dim)
    call = _library().ragkv_attend_rows_bf16 if bf16 else _library().ragkv_attend_rows
    failed = call(q.data_ptr(), seq, num_heads, keys.data_ptr(), values.data_ptr(), keys.shape[0], keys.stride(0),
                  dim, first.data_ptr(), end.data_ptr(), scale, out.data_ptr())
    if failed:  # the C side's own check of the CPU
        raise RuntimeError("bf16 row attention: this CPU has no AVX512-BF16")
    return out


def _rows_of(x: torch.Tensor) -> torch.Tensor:
    """[H, T, D] with each entry's D values side by side (a cache view keeps its own head stride)."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()
