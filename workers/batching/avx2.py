"""The AVX2 decode kernels (avx2.c): built with the machine's C compiler on first use, called through ctypes.

A decode step reads every weight once per token, so its speed is the speed of a 4-bit matrix-vector
product plus what each of the ~35 small ops of a layer costs to dispatch. avx2.c does both the way
llama.cpp does on this CPU class: integer dot products over the GGUF blocks themselves (Q4_1 and
Q8_0; the activations quantized per 32 to two int8 codes, ~15 bits, where llama.cpp keeps 8) and one
call per decoder layer (norms, projections, RoPE, the cache writes, attention, the MLP). Measured on
the default model, its logits are within 0.002 of the fp32 step's (int4's: 0.2). This module holds
the Python half:

    library()                 the compiled kernels, or None (and why: `unavailable()`) on a CPU
                              without AVX2/FMA/F16C, without a C compiler, or off x86
    pack(weight [N, K])       the matrix's exact GGUF blocks (Q4_1, else Q8_0), or None
    matvec(blocks, x [M, K])  -> [M, N] fp32
    NativeLayer / row()       one decoder layer's C arguments (built once) and a row's cache (per step)

The library is built, found or prebuilt (`python -m workers.native`) the way every C kernel is
(workers/native.py).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from workers import native
from workers.cache import LayerKV

SOURCE = Path(__file__).with_name("avx2.c")
GROUP = 32  # weights per block
Q4_1, Q8_0 = 0, 1  # avx2.c's block formats


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """(the compiled kernels, None), or (None, why not): built once per machine and source (workers.native)."""
    lib, why = native.load(SOURCE)
    if lib is None:
        return None, why
    lib.ragkv_matvec.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                 ctypes.c_int, ctypes.c_void_p]
    lib.ragkv_matvec.restype = None
    lib.ragkv_decode_layer.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_void_p]
    lib.ragkv_decode_layer.restype = None
    lib.ragkv_pack.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.ragkv_pack.restype = ctypes.c_int
    return lib, None


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None: see unavailable()."""
    return _load()[0]


def unavailable() -> str | None:
    """Why the kernels cannot run here, or None when they can."""
    return _load()[1]


def build(directory: Path) -> Path:
    """Compile avx2.c into `directory` -> the library's path (workers.native.build)."""
    return native.build(SOURCE, directory)


# -- blocks ------------------------------------------------------------------------------------------
@dataclass
class Blocks:
    """A weight matrix [n, k] as GGUF blocks: data [n, k / 32, block bytes] uint8 in `format`."""

    data: torch.Tensor
    format: int  # Q4_1 or Q8_0
    n: int
    k: int


def pack(weight: torch.Tensor) -> Blocks | None:
    """weight [N, K] (fp32, CPU) as its exact Q4_1 blocks, else Q8_0 blocks, else None: a group of 32 is
    taken only when it rebuilds its weights exactly (avx2.c's ragkv_pack, the arithmetic of
    linear.q4_groups / q8_groups), so a matrix of another format is refused."""
    n, k = weight.shape
    if k % GROUP:
        return None
    weight = weight.detach().float().contiguous()
    for fmt, size in ((Q4_1, 20), (Q8_0, 34)):
        data = torch.empty(n, k // GROUP, size, dtype=torch.uint8)
        if library().ragkv_pack(weight.data_ptr(), fmt, n, k, data.data_ptr()):
            return Blocks(data, fmt, n, k)
    return None


def matvec(blocks: Blocks, x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> x @ W.T [M, N] fp32 (the activations kept to ~15 bits per 32-block, avx2.c)."""
    x = x.float().contiguous()
    out = torch.empty(x.shape[0], blocks.n)
    library().ragkv_matvec(blocks.data.data_ptr(), blocks.format, blocks.n, blocks.k, x.data_ptr(), x.shape[0],
                           out.data_ptr())
    return out


# -- one decoder layer -------------------------------------------------------------------------------
class _Layer(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int), ("heads", ctypes.c_int), ("kv_heads", ctypes.c_int),
                ("head_dim", ctypes.c_int), ("intermediate", ctypes.c_int), ("eps", ctypes.c_float),
                ("scaling", ctypes.c_float), ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p),
                ("mats", ctypes.c_void_p * 4), ("formats", ctypes.c_int * 4)]


class _Row(ctypes.Structure):
    _fields_ = [("keys", ctypes.c_void_p), ("values", ctypes.c_void_p), ("kv_stride", ctypes.c_longlong),
                ("tokens", ctypes.c_int), ("mask", ctypes.c_void_p), ("mask_stride", ctypes.c_longlong),
                ("key_slot", ctypes.c_void_p), ("value_slot", ctypes.c_void_p), ("slot_stride", ctypes.c_longlong),
                ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("layer_stride", ctypes.c_longlong)]


@dataclass
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


def shape_refusal(shape: Shape) -> str | None:
    """Why avx2.c cannot run a model of this shape, or None."""
    if shape.head_dim % 8 or shape.heads % shape.kv_heads:
        return f"head_dim {shape.head_dim} is not a multiple of 8, or {shape.heads} heads do not group"
    if any(w % GROUP for w in (shape.hidden, shape.intermediate, shape.heads * shape.head_dim)):
        return "a matrix width is not a multiple of 32"
    return None


class NativeLayer:
    """One Llama decoder layer's C arguments (fp32 norms, the four block matrices), built once; the
    tensors are held here so their memory outlives the pointers."""

    def __init__(self, shape: Shape, norms: tuple[torch.Tensor, torch.Tensor], eps: float, scaling: float,
                 mats: tuple[Blocks, Blocks, Blocks, Blocks]):
        self.shape = shape
        self.norms = tuple(n.float().contiguous() for n in norms)
        self.mats = mats
        self.struct = _Layer(shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate, eps,
                             scaling, self.norms[0].data_ptr(), self.norms[1].data_ptr(),
                             (ctypes.c_void_p * 4)(*[m.data.data_ptr() for m in mats]),
                             (ctypes.c_int * 4)(*[m.format for m in mats]))

    def __call__(self, hidden: torch.Tensor, rows: list[_Row], layer: int) -> torch.Tensor:
        """hidden [B, hidden] fp32 (contiguous, updated in place), one row() per b, this layer's index (a row
        given once for every layer moves its pointers by layer x its layer_stride) -> queries [B, Hq, D]
        (rotated, unscaled)."""
        s = self.shape
        if hidden.dtype != torch.float32 or not hidden.is_contiguous():
            raise ValueError(f"avx2 decode: hidden must be contiguous fp32, got {hidden.dtype}")
        queries = torch.empty(hidden.shape[0], s.heads, s.head_dim)
        array = (_Row * len(rows))(*rows)
        library().ragkv_decode_layer(ctypes.addressof(self.struct), hidden.data_ptr(), ctypes.addressof(array),
                                     len(rows), layer, queries.data_ptr())
        return queries


def row(kv: LayerKV, mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, b: int,
        layer_stride: int = 0) -> _Row:
    """Row b's layer cache for avx2.c: kv (fp32, contiguous head_dim) already grown by the new token,
    whose entries the C layer writes: entry T - 1 of every kv head, or in the packed layout (keys
    [1, N, D]) the last kv_heads entries, head-major. mask [Hkv, T] bool or None; cos/sin [B, D]
    contiguous. layer_stride: elements from this layer's keys and values to the next layer's, where every
    layer of the row's cache lies in one buffer (KVCache.layer_stride, no mask): then this row, built over
    layer 0, serves every layer. Every tensor must stay alive until the layer call returns."""
    keys, values = kv.keys, kv.values
    strides = keys.stride()
    if keys.dtype != torch.float32 or values.dtype != torch.float32 or strides[-1] != 1 \
            or strides[-2] != keys.shape[-1] or values.stride() != strides:
        raise ValueError(f"avx2 decode: keys and values must be fp32 entries of contiguous head_dim in one "
                         f"layout, got {keys.dtype}/{values.dtype} strides {strides}/{values.stride()}")
    dim, tokens = keys.shape[-1], keys.shape[1]
    if kv.packed:  # one sequence of every head's entries: the new ones are the last kv_heads
        kv_stride, slot, slot_stride = 0, tokens - kv.kv_heads, dim
    else:
        kv_stride, slot, slot_stride = strides[0], tokens - 1, strides[0]
    mask_pointer, mask_stride = None, 0
    if mask is not None:
        if mask.stride(-1) != 1:
            raise ValueError("avx2 decode: the visibility mask must be contiguous along entries")
        mask_pointer, mask_stride = mask.data_ptr(), mask.stride(0)
    offset = 4 * slot * dim
    return _Row(keys.data_ptr(), values.data_ptr(), kv_stride, tokens, mask_pointer, mask_stride,
                keys.data_ptr() + offset, values.data_ptr() + offset, slot_stride,
                cos.data_ptr() + 4 * b * cos.stride(0), sin.data_ptr() + 4 * b * sin.stride(0), layer_stride)
