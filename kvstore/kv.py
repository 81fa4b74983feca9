"""ChunkKV: the KV cache of one chunk, as computed at positions 0..n-1."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kvstore.kernels import dispatch


@dataclass
class ChunkKV:
    """A compressed chunk (stored already evicted to a budget, workers/eviction/chunks.py) holds only its
    kept entries: slot j of layer l, head h is the token at positions[l, h, j] (keys RoPE'd there, or
    pre-RoPE), head_mask False = padding; `compression` is the spec (part of its content address)."""

    keys: torch.Tensor  # [layers, kv_heads, tokens, head_dim], RoPE applied for positions 0..tokens-1
    values: torch.Tensor  # [layers, kv_heads, tokens, head_dim]
    token_ids: list[int]
    # The RoPE frequencies [head_dim/2] the keys are rotated with (ModelRunner.chunk_kv sets them);
    # None when unknown. A pre-RoPE codec needs them to store the keys un-rotated.
    inv_freq: torch.Tensor | None = None
    # True: `keys` are pre-RoPE (un-rotated, as a pre-RoPE block stores them); use keys_at() to place them.
    pre_rope: bool = False
    positions: torch.Tensor | None = None  # [layers, kv_heads, slots] int64 (compressed chunks only)
    head_mask: torch.Tensor | None = None  # [layers, kv_heads, slots] bool (compressed chunks only)
    compression: dict | None = None  # the compression spec (compressed chunks only)

    def __post_init__(self) -> None:
        if self.keys.shape != self.values.shape or self.keys.dim() != 4:
            raise ValueError(f"keys {tuple(self.keys.shape)} and values {tuple(self.values.shape)} must be equal 4-d shapes")
        if self.positions is None and self.keys.shape[2] != len(self.token_ids):
            raise ValueError(f"{self.keys.shape[2]} KV tokens but {len(self.token_ids)} token ids")
        if self.positions is not None and (self.positions.shape != self.keys.shape[:3]
                                           or self.head_mask is None or self.head_mask.shape != self.keys.shape[:3]):
            raise ValueError(f"a compressed chunk needs positions and head_mask {tuple(self.keys.shape[:3])}")
        if self.pre_rope and self.inv_freq is None:
            raise ValueError("pre-RoPE keys need their inv_freq")

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[2]

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]

    def keys_at(self, start: int, inv_freq: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                device: torch.device | str | None = None) -> torch.Tensor:
        """Keys [L, H, T, D] rotated for positions start..start+T-1, with one rotation from either form,
        on `device` (default: where they are).

        Post-RoPE keys are re-rotated by `start`; pre-RoPE keys are rotated by start + their position (i for
        slot i; a compressed chunk's own positions per entry).
        Frequencies: the chunk's own, else `inv_freq`. Triton on CUDA (kvstore/kernels/dispatch.py)."""
        keys = self.keys.to(device) if device is not None else self.keys
        freq = self.inv_freq if self.inv_freq is not None else inv_freq
        if not self.pre_rope and start == 0:
            return keys.to(out_dtype or keys.dtype)
        if freq is None:
            raise ValueError("placing keys at an offset needs inv_freq")
        delta = start + self.slot_positions(keys.device) if self.pre_rope else start
        return dispatch.rerotate_keys(keys, delta, freq.to(keys.device), out_dtype=out_dtype)

    def slot_positions(self, device) -> torch.Tensor:
        """Each key slot's position in the chunk: [T], or [L, H, T] for a compressed chunk."""
        if self.positions is not None:
            return self.positions.to(device)
        return torch.arange(self.num_tokens, device=device)

    def with_rope(self, pre_rope: bool) -> "ChunkKV":
        """The same KV with keys in the asked form: pre-RoPE (un-rotated) or rotated at 0..n-1."""
        if pre_rope == self.pre_rope:
            return self
        if self.inv_freq is None:
            raise ValueError("un-rotating keys needs the chunk's inv_freq (ModelRunner.chunk_kv sets it)")
        if not pre_rope:
            return replace(self, keys=self.keys_at(0), pre_rope=False)
        positions = self.slot_positions(self.keys.device)
        keys = dispatch.rerotate_keys(self.keys, -positions, self.inv_freq.to(self.keys.device))
        return replace(self, keys=keys, pre_rope=True)
