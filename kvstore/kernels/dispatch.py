"""One function per kernel op: Triton on CUDA tensors, the torch reference otherwise (dequantizing on a CPU: C).

    backend=None / "auto": Triton when the input is on CUDA and triton imports, else torch; a CPU's dequantize
                            runs kvstore/kernels/dequant.c where it builds (native_quant.py: the reference's
                            values, bit for bit)
    backend="torch":        the reference (also forced everywhere by env RAGKV_FORCE_TORCH=1)
    backend="triton":       Triton on any device (CPU tensors need TRITON_INTERPRET=1; tests use this)

Triton is imported on first use, never by `import kvstore`. Ops, by codec:
    int8   quantize_token(x, 8, D, symmetric)       dequantize_token(..., 8, D, symmetric=...)
    int4   quantize_token(x, 4, G)                  dequantize_token(..., 4, G)
    KIVI layout (kivi2, k4v2, k3v2, ...; kvstore/codecs/kivi.py), key bits KB, value bits VB in 2, 3, 4:
           keys: quantize_channel(k, KB, G)         dequantize_channel(..., KB, G, delta=, inv_freq=)
           values: quantize_token(v, VB, G)         dequantize_token(..., VB, G)
    rerotate_keys(keys, delta, inv_freq): RoPE re-rotation of float keys (kvstore/rope.py).
"""

from __future__ import annotations

import functools
import math
import os

import torch

from kvstore.codecs import quant
from kvstore.kernels import native_quant, reference

KERNEL_BACKENDS = ("auto", "torch", "triton")


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(tensor: torch.Tensor, backend: str | None = None) -> str:
    """'torch' or 'triton' for an op on `tensor`."""
    backend = backend or "auto"
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "torch" or os.environ.get("RAGKV_FORCE_TORCH", "") not in ("", "0"):
        return "torch"
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' but triton is not installed")
        return "triton"
    return "triton" if tensor.is_cuda and triton_available() else "torch"


def _kernels():
    from kvstore.kernels import triton_quant

    return triton_quant


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[..., T, D] -> [LH, T, D] (LH = product of the leading axes)."""
    return x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:])


def _check_head_dim(d: int, bits: int) -> None:
    quant.check_pack(d, bits)


def quantize_token(x: torch.Tensor, bits: int, group_size: int, symmetric: bool = False, backend: str | None = None):
    """x [..., T, D] -> codes [..., T, D*bits/8], scale/zero [..., T, ceil(D/G)] fp16 (zero None if symmetric)."""
    reference.check_bits(bits, symmetric)
    _check_head_dim(x.shape[-1], bits)
    if resolve_backend(x, backend) == "torch":
        return reference.quantize_token(x, bits, group_size, symmetric)
    codes, scale, zero = _kernels().quantize(_flat(x), bits, group_size, symmetric, per_channel=False)
    lead = x.shape[:-2]
    return (codes.reshape(*lead, *codes.shape[1:]), scale.reshape(*lead, *scale.shape[1:]),
            None if zero is None else zero.reshape(*lead, *zero.shape[1:]))


def quantize_channel(x: torch.Tensor, bits: int, group_size: int, backend: str | None = None):
    """x [..., T, D] -> codes [..., T, D*bits/8], scale/zero [..., D, ceil(T/G)] fp16."""
    reference.check_bits(bits)
    _check_head_dim(x.shape[-1], bits)
    if resolve_backend(x, backend) == "torch":
        return reference.quantize_channel(x, bits, group_size)
    codes, scale, zero = _kernels().quantize(_flat(x), bits, group_size, False, per_channel=True)
    lead = x.shape[:-2]
    return (codes.reshape(*lead, *codes.shape[1:]), scale.reshape(*lead, *scale.shape[1:]),
            zero.reshape(*lead, *zero.shape[1:]))


def dequantize_token(codes, scale, zero, bits: int, group_size: int, *, symmetric: bool = False, delta=None,
                     inv_freq=None, out_dtype: torch.dtype = torch.float32, backend: str | None = None):
    """codes [..., T, D*bits/8] -> [..., T, D] out_dtype; keys re-rotated by `delta` when given."""
    reference.check_bits(bits, symmetric)
    if not symmetric and _native(codes, backend, group_size, per_channel=False):
        x = native_quant.dequantize(codes, scale, zero, bits, group_size, per_channel=False)
        return reference.rerotate_keys(x, delta, inv_freq, out_dtype)
    if resolve_backend(codes, backend) == "torch" or _per_layer(inv_freq):
        return reference.dequantize_token(codes, scale, zero, bits, group_size, symmetric=symmetric, delta=delta,
                                          inv_freq=inv_freq, out_dtype=out_dtype)
    head_dim = codes.shape[-1] * 8 // bits
    out = _kernels().dequantize(_flat(codes), _flat(scale), None if zero is None else _flat(zero), bits, group_size,
                                head_dim, symmetric=symmetric, delta=_check_rotation(delta, inv_freq),
                                inv_freq=inv_freq, out_dtype=out_dtype)
    return out.reshape(*codes.shape[:-1], head_dim)


def dequantize_channel(codes, scale, zero, bits: int, group_size: int, *, delta=None, inv_freq=None,
                       out_dtype: torch.dtype = torch.float32, backend: str | None = None):
    """codes [..., T, D*bits/8], scale/zero [..., D, ceil(T/G)] -> [..., T, D] out_dtype (re-rotated by delta)."""
    reference.check_bits(bits)
    if _native(codes, backend, group_size, per_channel=True):
        x = native_quant.dequantize(codes, scale, zero, bits, group_size, per_channel=True)
        return reference.rerotate_keys(x, delta, inv_freq, out_dtype)
    if resolve_backend(codes, backend) == "torch" or _per_layer(inv_freq):
        return reference.dequantize_channel(codes, scale, zero, bits, group_size, delta=delta, inv_freq=inv_freq,
                                            out_dtype=out_dtype)
    head_dim = codes.shape[-1] * 8 // bits
    out = _kernels().dequantize(_flat(codes), _flat(scale), _flat(zero), bits, group_size, head_dim,
                                per_channel=True, delta=_check_rotation(delta, inv_freq), inv_freq=inv_freq,
                                out_dtype=out_dtype)
    return out.reshape(*codes.shape[:-1], head_dim)


def rerotate_keys(keys: torch.Tensor, delta, inv_freq: torch.Tensor, out_dtype: torch.dtype | None = None,
                  backend: str | None = None) -> torch.Tensor:
    """keys [..., T, D] rotated at positions p -> at p + delta (int, [T], or keys.shape[:-1] per entry: the
    torch path), cast to out_dtype."""
    per_entry = torch.is_tensor(delta) and delta.dim() > 1
    if resolve_backend(keys, backend) == "torch" or per_entry or _per_layer(inv_freq):
        return reference.rerotate_keys(keys, delta, inv_freq, out_dtype)
    out = _kernels().dequantize(None, None, None, 8, 1, keys.shape[-1], raw=_flat(keys),
                                delta=_check_rotation(delta, inv_freq), inv_freq=inv_freq,
                                out_dtype=out_dtype or keys.dtype)
    return out.reshape(keys.shape)


def _native(codes: torch.Tensor, backend: str | None, group_size: int, per_channel: bool) -> bool:
    """`auto` on a CPU (not forced to the reference): the C kernels, where they take these codes."""
    forced = os.environ.get("RAGKV_FORCE_TORCH", "") not in ("", "0")
    return (backend or "auto") == "auto" and not forced and native_quant.fits(codes, group_size, per_channel)


def _per_layer(inv_freq) -> bool:
    """Per-layer frequencies [L, 1, 1, D/2] (Gemma 3): the Triton kernel takes one table, so the torch path."""
    return inv_freq is not None and inv_freq.dim() > 1


def _check_rotation(delta, inv_freq):
    if delta is not None and inv_freq is None:
        raise ValueError("re-rotation needs inv_freq")
    return delta
