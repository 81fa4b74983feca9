"""Token-by-token decoding from a filled KVCache (greedy by default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from workers.cache import KVCache


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits: [vocab] -> token id."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass
class DecodeHooks:
    """Called around each decode step; eviction keeps the cache within budget here."""

    observer: Callable | None = None  # passed to the runner (sees queries and KV)
    after_step: Callable[[KVCache], None] | None = None
    should_stop: Callable[[], bool] | None = None  # e.g. the request was cancelled


def decode(runner, cache: KVCache, first_logits: torch.Tensor, next_position: int, params: SamplingParams,
           hooks: DecodeHooks | None = None) -> Iterator[int]:
    """Yield new token ids, starting from the logits of the prompt's last token ([vocab] or [1, vocab])."""
    hooks = hooks or DecodeHooks()
    generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    stop_ids = runner.stop_token_ids
    logits = first_logits.reshape(-1)
    for step in range(params.max_new_tokens):
        token = sample_token(logits, params, generator)
        if token in stop_ids:
            return
        yield token
        if step == params.max_new_tokens - 1 or (hooks.should_stop and hooks.should_stop()):
            return
        ids = torch.tensor([token], device=runner.device)
        positions = torch.tensor([next_position + step], device=runner.device)
        logits = runner.forward(ids, positions, cache, observer=hooks.observer).reshape(-1)
        if hooks.after_step is not None:
            hooks.after_step(cache)
