"""Greedy answer from stored chunk KV under an adapter: the ordinary blend path, run by the adapter's runner."""

from __future__ import annotations

import torch

from kvstore.kv import ChunkKV
from workers.blend import BlendConfig, blend_prefill, fuse_chunks
from workers.generate import SamplingParams, decode
from workers.prompt import PromptLayout
from workers.runner import ModelRunner


@torch.inference_mode()
def answer(runner: ModelRunner, layout: PromptLayout, prefix: ChunkKV, chunks: list[ChunkKV],
           max_new_tokens: int = 12, reuse: bool = False, config: BlendConfig = BlendConfig()) -> list[int]:
    """Greedy token ids. `runner` must be the model the caches belong to (the adapter model)."""
    cache, computed = fuse_chunks(runner, layout, prefix, chunks)
    logits, _ = blend_prefill(runner, layout, cache, computed, config, reuse=reuse)
    return list(decode(runner, cache, logits, layout.num_tokens, SamplingParams(max_new_tokens, 0.0, 1.0, None)))
