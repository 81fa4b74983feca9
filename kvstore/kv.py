"""ChunkKV: the KV cache of one chunk, as computed at positions 0..n-1."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ChunkKV:
    keys: torch.Tensor  # [layers, kv_heads, tokens, head_dim], RoPE applied for positions 0..tokens-1
    values: torch.Tensor  # [layers, kv_heads, tokens, head_dim]
    token_ids: list[int]

    def __post_init__(self) -> None:
        if self.keys.shape != self.values.shape or self.keys.dim() != 4:
            raise ValueError(f"keys {tuple(self.keys.shape)} and values {tuple(self.values.shape)} must be equal 4-d shapes")
        if self.keys.shape[2] != len(self.token_ids):
            raise ValueError(f"{self.keys.shape[2]} KV tokens but {len(self.token_ids)} token ids")

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[2]

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]
