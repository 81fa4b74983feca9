"""Drift: the context-dependent shift between a chunk's stored K/V and its K/V in the prompt.

Research only: the product's blend loop no longer runs it (its hook left workers/runner.py on 2026-12-06; it was
off by default and never beat the default on dev). A chunk's KV is computed without the chunks before it. Measured on the quality suite's dev
split (research/blend.md, "Key drift"), the harm of reusing it sits almost all in the keys:

- exact keys with stored values recover most of full prefill's answers, exact values with
  stored keys do worse than plain reuse;
- before rotary embedding, the key error of a chunk is dominated by one shift vector per
  (layer, kv head), and that vector points the same way in every chunk of a prompt and across
  prompts (cosine 0.8-0.98): it is mostly what the earlier context does to every key.

So the tokens a blend recomputes measure the shift for free: at each layer, per chunk, the mean
over its recomputed tokens of (fresh - stored) keys, un-rotated to pre-RoPE, per kv head. Adding
it to the chunk's other stored keys (rotated to each key's position) repairs the bulk of the
error before the layer attends. Values get the same treatment without the rotation. Plain
torch; the blend loop (workers/blend.py, DriftRepair) calls it. Shapes: H = kv heads, T tokens,
D head dim, C chunks.
"""

from __future__ import annotations

import torch

from kvstore.rope import rerotate_keys


def chunk_index(tokens: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    """tokens [T] (prompt indices inside chunk spans, sorted spans) -> [T] index of the span each is in."""
    starts = torch.tensor([start for start, _ in spans], device=tokens.device)
    return torch.bucketize(tokens, starts, right=True) - 1


def chunk_means(diff: torch.Tensor, chunk_of: torch.Tensor, num_chunks: int,
                held: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of diff [H, T, D] over each chunk's tokens (chunk_of [T] in 0..C-1) -> [H, C, D] fp32.

    held [H, T]: which entries count (a chunk compressed at ingest drops some per head). A chunk with
    no counted token gets the mean over all of them."""
    weight = torch.ones(diff.shape[:2], device=diff.device) if held is None else held.float()  # [H, T]
    heads, _, dim = diff.shape
    sums = torch.zeros(heads, num_chunks, dim, device=diff.device).index_add_(1, chunk_of, diff * weight[..., None])
    counts = torch.zeros(heads, num_chunks, device=diff.device).index_add_(1, chunk_of, weight)  # [H, C]
    overall = sums.sum(dim=1) / counts.sum(dim=1).clamp(min=1)[:, None]  # [H, D]
    means = sums / counts.clamp(min=1)[..., None]
    return torch.where(counts[..., None] > 0, means, overall[:, None, :])


def key_drift(fresh: torch.Tensor, stored: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
              chunk_of: torch.Tensor, num_chunks: int, held: torch.Tensor | None = None) -> torch.Tensor:
    """Per-chunk mean pre-RoPE key shift. fresh/stored: [H, T, D] keys rotated at positions [T] -> [H, C, D]."""
    return chunk_means(rerotate_keys((fresh - stored).float(), -positions, inv_freq), chunk_of, num_chunks, held)


def value_drift(fresh: torch.Tensor, stored: torch.Tensor, chunk_of: torch.Tensor, num_chunks: int,
                held: torch.Tensor | None = None) -> torch.Tensor:
    """Per-chunk mean value shift. fresh/stored: [H, T, D] -> [H, C, D]."""
    return chunk_means((fresh - stored).float(), chunk_of, num_chunks, held)


def shift_keys(keys: torch.Tensor, drift: torch.Tensor, positions: torch.Tensor,
               inv_freq: torch.Tensor) -> torch.Tensor:
    """keys [H, T, D] rotated at positions [T] + each token's pre-RoPE drift [H, T, D] rotated to its position."""
    return (keys.float() + rerotate_keys(drift.float(), positions, inv_freq)).to(keys.dtype)


def shift_values(values: torch.Tensor, drift: torch.Tensor) -> torch.Tensor:
    """values [H, T, D] + each token's drift [H, T, D]."""
    return (values.float() + drift).to(values.dtype)
