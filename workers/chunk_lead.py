"""Chunk KV computed after a fixed lead-in (an experiment, not the serving default).

A chunk computed alone at positions 0..n-1 makes its first token an attention sink: every
later token of the chunk pours attention into it, and when the chunk is reused after other
chunks the question sees N spurious sinks. Computing the chunk after a fixed shared lead-in
(APE's shared prefix, Yang et al., ICLR 2025) gives the chunk the sink of a real prompt's
start instead; the lead-in's KV is dropped and the chunk's keys are moved back to positions
0..n-1, so the stored form (and fusing) is unchanged. The lead-in changes the bytes, so a
store using it must put the lead-in's ids in the content address.
"""

from __future__ import annotations

import torch

from kvstore.kv import ChunkKV
from workers.cache import KVCache
from workers.rope import rerotate_keys


def lead_in_ids(runner) -> list[int]:
    """The default lead-in: the model's own chat-template prefix with the default system prompt."""
    from workers.prompt import template_parts

    return runner.tokenize(template_parts(runner.tokenizer, "")[0])


@torch.inference_mode()
def chunk_kv_after(runner, token_ids: list[int], lead_ids: list[int]) -> ChunkKV:
    """KV of `token_ids` computed after `lead_ids`, lead-in dropped, keys at positions 0..n-1."""
    if not token_ids:
        raise ValueError("chunk has no tokens")
    ids = torch.tensor(list(lead_ids) + list(token_ids), device=runner.device)
    cache = KVCache.empty(runner.shape.num_layers)
    runner.forward(ids, torch.arange(ids.numel(), device=runner.device), cache)
    lead = len(lead_ids)
    keys = torch.stack([layer.keys[:, lead:] for layer in cache.layers])  # [L, H, T, D] at lead..lead+T-1
    values = torch.stack([layer.values[:, lead:] for layer in cache.layers])
    keys = rerotate_keys(keys, -lead, runner.inv_freq).to(runner.dtype)
    return ChunkKV(keys=keys, values=values, token_ids=list(token_ids), inv_freq=runner.inv_freq)
