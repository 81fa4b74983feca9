"""Prefill modes, registered by name: one small function each, the same shape as codecs and policies.

A mode fills a KVCache for the whole prompt and returns the logits of its last token:

    full     plain prefill of every prompt token
    prefix   the system-prompt prefix block reused as an exact prefix, the rest prefilled
    reuse    stored chunk KV placed after the prefix, nothing recomputed (only the question)
    shift    reuse, with every stored chunk entry shifted first by the model's context drift
             (workers/context_drift.py): reuse's cost, and on the quality suite's `dev` split
             0.594 against reuse's 0.458 (blend at 15%: 0.667; docs/blend.md "The shift mode")
    blend    stored chunk KV plus CacheBlend's selective recompute (workers/blend.py)

The engine hands a mode a PrefillContext: what it needs from the store and from blending comes
as callables, so this module imports neither (and workers.requests can validate `mode` against
PREFILL_MODES without an import circle). A new mode is a function here with `@prefill_mode(NAME)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from kvstore.kv import ChunkKV
from kvstore.registry import registrar
from workers.cache import KVCache

if TYPE_CHECKING:
    from workers.prompt import PromptLayout
    from workers.runner import AttentionObserver, ModelRunner


@dataclass
class PrefillContext:
    runner: ModelRunner
    layout: PromptLayout
    observer: AttentionObserver | None
    stats: dict  # the request's stats; a mode adds what it did (recomputed_tokens, prefix_hit, ...)
    prefix_kv: Callable[[], tuple[ChunkKV, bool]]  # the system-prompt prefix block -> (kv, was a hit)
    stored_chunks: Callable[[ChunkKV], tuple[KVCache, torch.Tensor]]  # prefix -> (cache, computed [S] bool)
    # (cache, computed, reuse, shift) -> logits; shift: None = as the blend setting decides, True = the drift alone
    blend: Callable[[KVCache, torch.Tensor, bool, bool | None], torch.Tensor]
    cache: KVCache | None = None  # set by the mode

    def ids_and_positions(self, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt token ids and positions from `start` on: [S - start] each, on the runner's device."""
        device = self.runner.device
        ids = torch.tensor(self.layout.token_ids, device=device)
        return ids[start:], torch.arange(self.layout.num_tokens, device=device)[start:]


PrefillMode = Callable[[PrefillContext], torch.Tensor]
PREFILL_MODES: dict[str, PrefillMode] = {}


prefill_mode = registrar(PREFILL_MODES, "prefill mode")


def kv_nbytes(kv: ChunkKV) -> int:
    return kv.keys.nbytes + kv.values.nbytes


def _prefix(ctx: PrefillContext) -> ChunkKV:
    prefix, hit = ctx.prefix_kv()
    ctx.stats["prefix_hit"] = hit
    ctx.stats["kv_bytes_loaded"] += kv_nbytes(prefix) if hit else 0
    return prefix


@prefill_mode("full")
def full(ctx: PrefillContext) -> torch.Tensor:
    runner = ctx.runner
    ctx.cache = KVCache.empty(runner.shape.num_layers)
    ids, positions = ctx.ids_and_positions()
    ctx.stats["recomputed_tokens"] = ctx.layout.num_tokens
    return runner.forward(ids, positions, ctx.cache, observer=ctx.observer)


@prefill_mode("prefix")
def prefix(ctx: PrefillContext) -> torch.Tensor:
    runner, layout = ctx.runner, ctx.layout
    ctx.cache = KVCache.from_chunk(_prefix(ctx), device=runner.device, dtype=runner.dtype)
    ids, positions = ctx.ids_and_positions(layout.prefix_len)
    ctx.stats["recomputed_tokens"] = layout.num_tokens - layout.prefix_len
    return runner.forward(ids, positions, ctx.cache, observer=ctx.observer)


@prefill_mode("reuse")
def reuse(ctx: PrefillContext) -> torch.Tensor:
    ctx.cache, computed = ctx.stored_chunks(_prefix(ctx))
    return ctx.blend(ctx.cache, computed, True, False)


@prefill_mode("shift")
def shift(ctx: PrefillContext) -> torch.Tensor:
    ctx.cache, computed = ctx.stored_chunks(_prefix(ctx))
    return ctx.blend(ctx.cache, computed, True, True)


@prefill_mode("blend")
def blend(ctx: PrefillContext) -> torch.Tensor:
    ctx.cache, computed = ctx.stored_chunks(_prefix(ctx))
    return ctx.blend(ctx.cache, computed, False, None)
