"""Shared test data for the kvstore tests (a plain module: conftest.py is not importable by name)."""

from __future__ import annotations

import torch

from kvstore.kv import ChunkKV

TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. From the lamp room he could see "
    "the fishing boats returning to the harbour, their lanterns swaying with the swell. In winter the storms "
    "came in from the north-west, and the keeper logged wind speed, visibility and the state of the sea in a "
    "leather-bound book. Ships relied on the beam to find the narrow channel between the reef and the cliffs."
)


def tiny_kv(tokens: int = 5, seed: int = 0, layers: int = 2, heads: int = 1, dim: int = 8) -> ChunkKV:
    """Random KV with RoPE frequencies (theta 1e4), so pre-RoPE codecs can store it too."""
    g = torch.Generator().manual_seed(seed)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    return ChunkKV(torch.randn(layers, heads, tokens, dim, generator=g),
                   torch.randn(layers, heads, tokens, dim, generator=g),
                   list(range(100 + seed, 100 + seed + tokens)), inv_freq=inv_freq)
