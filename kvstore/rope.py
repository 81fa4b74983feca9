"""RoPE math, below both the kernels (kvstore/kernels) and the model runner (workers/runner.py).

RoPE rotates each (x_i, x_{i+D/2}) pair by angle pos * inv_freq_i. Rotations
compose, so a key rotated for position p becomes the key for position p + delta
by one more rotation of delta * inv_freq_i — exact up to float rounding, with no
need for the un-rotated key.

`inv_freq` is [D/2], or [L, 1, 1, D/2] for a model whose layers rotate with different bases (Gemma 3):
every function here broadcasts it over keys [L, H, T, D]; one layer's keys take `layer_freq(inv_freq, l)`.
"""

from __future__ import annotations

import torch

# rope types whose frequencies do not depend on the sequence length, so rotation composes exactly
RE_ROTATABLE_ROPE_TYPES = {"default", "linear", "llama3", "yarn"}


def layer_freq(inv_freq: torch.Tensor, layer: int) -> torch.Tensor:
    """One layer's frequencies [D/2] from a model's: [D/2] (every layer alike) or [L, 1, 1, D/2] (per layer,
    Gemma 3's local and global bases; broadcasts over a chunk's keys [L, H, T, D/2])."""
    return inv_freq if inv_freq.dim() == 1 else inv_freq[layer].reshape(-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [..., T] -> cos, sin: [..., T, D] (unit-scaled, fp32)."""
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(torch.float32)  # [..., T, D/2]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., T, D]; cos/sin: [T, D] (or broadcastable), halves equal as rope_cos_sin makes them
    -> x rotated, in x's dtype: each pair (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), the same as
    x * cos + rotate_half(x) * sin, written half by half with no rotate_half copy.

    The products are taken in the wider of the two dtypes (fp32 cos/sin lift a half-precision x;
    the runner passes cos/sin already cast to the model dtype, so its math stays in that dtype)."""
    half = x.shape[-1] // 2
    dtype = torch.promote_types(x.dtype, cos.dtype)
    x1, x2 = x[..., :half].to(dtype), x[..., half:].to(dtype)
    c, s = cos[..., :half], sin[..., :half]
    out = torch.empty(torch.broadcast_shapes(x.shape, cos.shape), dtype=dtype, device=x.device)
    torch.mul(x1, c, out=out[..., :half]).addcmul_(x2, s, value=-1)
    torch.mul(x2, c, out=out[..., half:]).addcmul_(x1, s)
    return out.to(x.dtype)


class RopeTable:
    """cos/sin for positions 0..P-1, made once and grown by doubling, so a forward pass looks its
    positions up instead of taking cos and sin again in every layer (nano-vllm's cos_sin_cache).
    Entries are rope_cos_sin's, times `scale`, cast to `dtype`: the same values bit for bit. The pair
    is replaced as one tuple, so a reader on another thread never sees a cos and a sin of two sizes."""

    def __init__(self, inv_freq: torch.Tensor, scale: float = 1.0, dtype: torch.dtype = torch.float32):
        self.inv_freq, self.scale, self.dtype = inv_freq, scale, dtype
        self.table = (torch.empty(0, 2 * inv_freq.numel(), dtype=dtype),) * 2  # (cos, sin) [P, D]

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [..., T] (>= 0) -> cos, sin [..., T, D] on positions' device."""
        cos, sin = self.covering(positions)
        return cos[positions], sin[positions]

    def covering(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole tables cos, sin [P, D] on positions' device, grown until P is above every position."""
        cos, sin = self.table
        if positions.numel() and int(positions.max()) >= cos.shape[0]:
            size = max(2 * cos.shape[0], int(positions.max()) + 1, 64)
            cos, sin = rope_cos_sin(torch.arange(size, device=positions.device), self.inv_freq.to(positions.device))
            cos, sin = (cos * self.scale).to(self.dtype), (sin * self.scale).to(self.dtype)
            self.table = (cos, sin)
        if cos.device != positions.device:
            cos, sin = cos.to(positions.device), sin.to(positions.device)
            self.table = (cos, sin)
        return cos, sin


def rerotate_keys(keys: torch.Tensor, delta: int | torch.Tensor, inv_freq: torch.Tensor,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """keys: [..., T, D] rotated at positions p -> rotated at p + delta, in fp32 math, cast to out_dtype
    (default keys.dtype). delta: an int, [T] (per token) or keys.shape[:-1] (per entry: a compressed
    chunk's heads keep different tokens)."""
    if isinstance(delta, int) or (torch.is_tensor(delta) and delta.dim() == 0):
        return rotate_by(keys, int(delta), inv_freq).to(out_dtype or keys.dtype)
    deltas = torch.as_tensor(delta, device=keys.device)  # [T] or keys.shape[:-1]: one angle per key
    cos, sin = rope_cos_sin(deltas, inv_freq.to(keys.device))
    return apply_rope(keys.float(), cos, sin).to(out_dtype or keys.dtype)


def rotate_by(keys: torch.Tensor, delta: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """keys: [..., D] -> every key rotated by the same `delta` positions, in fp32 (a whole chunk moved to its
    offset). The angles are one per frequency [D/2], so each half is two multiply-adds over the halves:
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), with no per-token tables or rotate_half copies."""
    x = keys.float()
    half = x.shape[-1] // 2
    angles = torch.tensor(float(delta), device=x.device) * inv_freq.to(x.device, torch.float32)  # [D/2]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty_like(x)
    torch.mul(x1, cos, out=out[..., :half]).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=out[..., half:]).addcmul_(x1, sin)
    return out
