"""A fixed orthogonal rotation of the head dimension before quantization (QuaRot-style incoherence).

Quantizing x·R instead of x spreads each key's few outlier channels over all channels, so one
group's range is no longer set by an outlier; decoding multiplies by Rᵀ, which undoes R exactly up
to float rounding (R is orthogonal). R = diag(s)·H/√D: H the Sylvester Hadamard matrix of order D
(a power of two) and s a fixed ±1 pattern, the same on every machine (it is part of the codec's
definition, not a random draw at run time). Plain torch; the quantization kernels never see R.
"""

from __future__ import annotations

import functools
import math

import torch


def check_dim(dim: int) -> None:
    if dim < 2 or dim & (dim - 1):
        raise ValueError(f"a rotated codec needs a power-of-two head_dim, got {dim}")


def _signs(dim: int) -> torch.Tensor:
    """A fixed ±1 pattern: bit 0 of a 32-bit LCG stream seeded by dim (no torch RNG, so no version drift)."""
    state, out = dim * 2654435761 & 0xFFFFFFFF, []
    for _ in range(dim):
        state = (1664525 * state + 1013904223) & 0xFFFFFFFF
        out.append(1.0 if state >> 31 else -1.0)
    return torch.tensor(out, dtype=torch.float64)


@functools.cache
def _matrix(dim: int) -> torch.Tensor:
    """R [D, D] float64 on CPU: diag(signs) @ H / sqrt(D), orthogonal."""
    check_dim(dim)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return _signs(dim)[:, None] * h / math.sqrt(dim)


@functools.cache
def rotation(dim: int, device: torch.device | str) -> torch.Tensor:
    """R [D, D] float32 on `device`, made once per device (every block encode and decode uses it)."""
    return _matrix(dim).to(device=device, dtype=torch.float32)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> x·R [..., D] float32."""
    return x.float() @ rotation(x.shape[-1], x.device)


def unrotate(y: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """y [..., D] -> y·Rᵀ [..., D] in `dtype` (default y's): the inverse of rotate."""
    return (y.float() @ rotation(y.shape[-1], y.device).T).to(dtype or y.dtype)
