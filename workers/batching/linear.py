"""Decode-step linear kernels, registered by name: every one is batch invariant.

A decode step multiplies a few rows (one per running request) by every weight matrix of the
model, so it reads all the weights once per step and is bound by memory, not arithmetic. The
kernel that does it must give row i the same bits whatever the other rows are, or a request's
greedy tokens would depend on who it was batched with:

    fp32   the model's own fp32 weights. Row results of a BLAS gemm depend on the number of
           rows (M = 1 takes a gemv path), so rows are padded to a fixed count, `pad_rows`.
           Exact: the same arithmetic as the prefill.
    int4   the model's own 4-bit weights (GGUF Q4_1: 32-column groups of q * d + m, q in 0..15)
           recovered exactly from the fp32 matrix and multiplied by torch's CPU int4 kernel with
           bf16 activations (scales rounded to bf16). A quarter of the bytes per step. A matrix
           that is not exactly such 4-bit groups, or the Q8_0 embedding (split into two 4-bit
           halves), is handled the same way when exact, else falls back to fp32. Gemma 3 270M's GGUF
           (Q4_K_M): only its Q8_0 embedding (the tied lm_head) packs; q, k, gate and up are Q5_0
           (5-bit codes), o Q4_K (6-bit sub-block scales), down Q6_K: those run in fp32.
    avx2   the same GGUF blocks (Q4_1, and Q8_0 for the embedding) kept as they are and multiplied by
           avx2.c's integer dot products (activations as 16-bit codes per 32; llama.cpp keeps 8 bits).
           Its matrices run inside avx2.c's whole-layer call (step.py), never in the scripted layer;
           a model avx2.c cannot serve, or a machine that cannot build it, decodes with int4 instead.

`DecodeLinear.__call__(x [M, K]) -> [M, N]` in the kernel's own dtype (fp32 or bf16): the caller adds
it into an fp32 residual in place, or casts it, so no extra conversion is paid. The arithmetic is
one plain function, `apply_linear(x, kind, tensors, pad_rows)`, that the scripted decode layer
(layer.py) calls with a kernel's `kind` and `tensors`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, List

import torch

from kvstore.registry import registrar
from workers.batching import avx2

GROUP = 32
PROBE_ROWS = 64  # groups are tried on a matrix's first rows before all of it (see probed)
DECODE_KERNELS: dict[str, Callable[[torch.Tensor, int], "DecodeLinear"]] = {}
DEFAULT_DECODE_KERNEL = "avx2"  # the default model's own GGUF blocks (int4 where avx2 cannot run); fp32 is exact


decode_kernel = registrar(DECODE_KERNELS, "decode kernel")


PADDED_GEMM, INT4_PARTS, NATIVE = 0, 1, 2  # apply_linear's kinds (TorchScript reads no globals: it spells them)


def apply_linear(x: torch.Tensor, kind: int, tensors: List[torch.Tensor], pad_rows: int) -> torch.Tensor:
    """x [M, K] -> [M, N]. PADDED_GEMM: tensors = [weight [N, K]], rows padded to a multiple of
    `pad_rows`. INT4_PARTS: tensors = [packed, scale_zero] per 4-bit part, summed in fp32 when there
    are several (bf16 activations). TorchScript-compatible (layer.py scripts its callers)."""
    if kind == 0:  # PADDED_GEMM
        weight = tensors[0]
        rows = x.shape[0]
        padded = (rows + pad_rows - 1) // pad_rows * pad_rows
        if padded != rows:
            x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
        return torch.mm(x.to(weight.dtype), weight.t())[:rows]
    if kind == 2:  # NATIVE
        raise RuntimeError("avx2 matrices run in avx2.c's layer call, not in the scripted layer")
    x = x.to(torch.bfloat16)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, tensors[0], 32, tensors[1])  # INT4_PARTS, GROUP
    if len(tensors) == 2:
        return out
    out = out.float()
    for i in range(2, len(tensors), 2):
        out += torch.ops.aten._weight_int4pack_mm_for_cpu(x, tensors[i], 32, tensors[i + 1])
    return out


class DecodeLinear:
    """A weight matrix in a decode kernel's form: `kind` and `tensors` are apply_linear's arguments."""

    kernel: str = "?"
    kind: int
    tensors: List[torch.Tensor]
    pad_rows: int = 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return apply_linear(x, self.kind, self.tensors, self.pad_rows)


@dataclass
class PaddedLinear(DecodeLinear):
    """fp32 gemm with the rows padded to `pad_rows` (or the next multiple of it): same bits at any batch size."""

    weight: torch.Tensor  # [N, K]
    pad_rows: int
    kernel: str = "fp32"

    def __post_init__(self) -> None:
        self.kind, self.tensors = PADDED_GEMM, [self.weight]


def probed(groups_of: Callable) -> Callable:
    """groups_of(weight [N, K]) -> groups or None, tried on the first PROBE_ROWS rows before the whole matrix.
    Groups lie within a row, so a matrix whose first rows are not exact groups is not either: a matrix
    of another format (Gemma 3's Q4_K and Q6_K) is refused after a few rows instead of every one."""

    @functools.wraps(groups_of)
    def first_rows_then_all(weight: torch.Tensor):
        if weight.shape[0] > PROBE_ROWS and groups_of(weight[:PROBE_ROWS]) is None:
            return None
        return groups_of(weight)

    return first_rows_then_all


@probed
def q4_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """weight [N, K] -> (codes [N, K] int32 in 0..15, d [N, K/32], m [N, K/32]) with
    weight == codes * d + m exactly (d an fp16 value), or None when the matrix is not such groups."""
    rows, cols = weight.shape
    if cols % GROUP:
        return None
    groups = weight.float().reshape(rows, cols // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    d = ((high - low) / 15).half().float()  # Q4_1 stores d as fp16
    codes = torch.round((groups - low[..., None]) / torch.where(d > 0, d, 1)[..., None]).clamp(0, 15)
    if not torch.equal(codes * d[..., None] + low[..., None], groups):
        return None
    return codes.reshape(rows, cols).to(torch.int32), d, low


@probed
def q8_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """weight [N, K] -> (codes [N, K] int32 in -127..127, d [N, K/32]) with weight == codes * d exactly
    (GGUF Q8_0), or None."""
    rows, cols = weight.shape
    if cols % GROUP:
        return None
    groups = weight.float().reshape(rows, cols // GROUP, GROUP)
    d = (torch.maximum(groups.amax(-1), -groups.amin(-1)) / 127).half().float()  # no |groups| copy
    codes = (groups / torch.where(d > 0, d, 1)[..., None]).round_().clamp_(-127, 127)
    if not torch.equal(codes * d[..., None], groups):
        return None
    return codes.reshape(rows, cols).to(torch.int32), d


@dataclass
class Int4Part:
    packed: torch.Tensor  # torch's CPU int4 tile layout of codes [N, K]
    scale_zero: torch.Tensor  # [K/32, N, 2] bf16: w = (code - 8) * scale + zero


def int4_part(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Int4Part:
    """codes [N, K] in 0..15, scale/zero [N, K/32] (weight = codes * scale + zero)."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
    scale_zero = torch.stack([scale, zero + 8 * scale], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return Int4Part(packed, scale_zero)


@dataclass
class Int4Linear(DecodeLinear):
    """Sum of 4-bit matmuls (one for Q4_1, two nibbles for Q8_0) with bf16 activations."""

    parts: list[Int4Part]
    kernel: str = "int4"

    def __post_init__(self) -> None:
        self.kind = INT4_PARTS
        self.tensors = [t for part in self.parts for t in (part.packed, part.scale_zero)]


def pack_int4(weight: torch.Tensor) -> Int4Linear | None:
    """The exact 4-bit form of `weight` [N, K] (Q4_1 groups, or Q8_0 as a high and a low nibble), or None."""
    q4 = q4_groups(weight)
    if q4 is not None:
        codes, d, m = q4
        return Int4Linear([int4_part(codes, d, m)])
    q8 = q8_groups(weight)
    if q8 is None:
        return None
    codes, d = q8
    biased = codes.add_(128)  # 1..255 = 16 * high + low; w = d * (16 * high + low - 128)
    high = biased >> 4
    low = biased.bitwise_and_(15)  # in place: the embedding's codes are the largest tensor built here
    return Int4Linear([int4_part(high, 16 * d, -128 * d), int4_part(low, d, torch.zeros_like(d))])


@decode_kernel("fp32")
def fp32_kernel(weight: torch.Tensor, pad_rows: int) -> DecodeLinear:
    return PaddedLinear(weight.detach(), pad_rows)


@decode_kernel("int4")
def int4_kernel(weight: torch.Tensor, pad_rows: int) -> DecodeLinear:
    if weight.device.type != "cpu":  # the int4 kernel here is torch's CPU one
        return fp32_kernel(weight, pad_rows)
    return pack_int4(weight.detach()) or fp32_kernel(weight, pad_rows)


@dataclass
class Avx2Linear(DecodeLinear):
    """The matrix's own GGUF blocks, multiplied by avx2.c (fp32 out)."""

    blocks: avx2.Blocks
    kernel: str = "avx2"

    def __post_init__(self) -> None:
        self.kind, self.tensors = NATIVE, [self.blocks.data]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return avx2.matvec(self.blocks, x)


@decode_kernel("avx2")
def avx2_kernel(weight: torch.Tensor, pad_rows: int) -> DecodeLinear:
    if weight.device.type != "cpu" or avx2.library() is None:
        return int4_kernel(weight, pad_rows)
    blocks = avx2.pack(weight)
    return Avx2Linear(blocks) if blocks is not None else int4_kernel(weight, pad_rows)
