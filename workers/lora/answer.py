"""Greedy answer from stored chunk KV under an adapter: the ordinary blend path, run by the adapter's runner."""

from __future__ import annotations

import torch

from dataclasses import replace

from kvstore.kv import ChunkKV
from workers.blend import BlendConfig
from workers.generate import SamplingParams, decode
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.prompt import PromptLayout
from workers.runner import ModelRunner


@torch.inference_mode()
def answer(runner: ModelRunner, layout: PromptLayout, prefix: ChunkKV, chunks: list[ChunkKV],
           max_new_tokens: int = 12, reuse: bool = False, config: BlendConfig = BlendConfig()) -> list[int]:
    """Greedy token ids. `runner` must be the model the caches belong to (the adapter model)."""
    plan = replace(plan_for("reuse" if reuse else "blend", config), shift=False)  # no drift measured per adapter
    out = run_prefill(runner, layout, plan, HeldChunks(prefix, chunks))
    return list(decode(runner, out.cache, out.logits, layout.num_tokens, SamplingParams(max_new_tokens, 0.0, 1.0, None)))
