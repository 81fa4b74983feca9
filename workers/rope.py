"""RoPE re-rotation: move stored keys from positions 0..n-1 to new offsets.

RoPE rotates each (x_i, x_{i+D/2}) pair by angle pos * inv_freq_i. Rotations
compose, so a key rotated for position p becomes the key for position p + delta
by one more rotation of delta * inv_freq_i — exact up to float rounding, with no
need for the un-rotated key.
"""

from __future__ import annotations

import torch

# rope types whose frequencies do not depend on the sequence length, so rotation composes exactly
RE_ROTATABLE_ROPE_TYPES = {"default", "linear", "llama3", "yarn"}


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [T] -> cos, sin: [T, D] (unit-scaled, fp32)."""
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]  # [T, D/2]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., T, D]; cos/sin: [T, D]."""
    return (x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)


def rerotate_keys(keys: torch.Tensor, delta: int | torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """keys: [..., T, D] rotated at positions p -> rotated at p + delta (delta: int or [T])."""
    num_tokens = keys.shape[-2]
    deltas = torch.as_tensor(delta, device=keys.device).expand(num_tokens) if torch.as_tensor(delta).dim() == 0 \
        else torch.as_tensor(delta, device=keys.device)
    cos, sin = rope_cos_sin(deltas, inv_freq.to(keys.device))
    return apply_rope(keys, cos, sin)
