"""KVzip (Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction").

A KV pair matters if the model needs it to reproduce its context. So the model is
asked to repeat the cached context ("Repeat the previous context exactly." and the
context tokens again, teacher-forced), and every cached slot is scored by the
largest attention it receives from any of those reconstruction queries (max over
the queries and over the query heads of its GQA group). The question takes no part:
the scores are query-agnostic, which is what lets ragkv pay for them once, at ingest.

As in the paper, the reconstruction runs piece by piece (`piece_tokens` context tokens
at a time, so memory stays bounded): the queries of a piece's repeat see the attention
sinks, that piece of the context and the repeat's own tokens; later pieces restate the
last few tokens of the previous one ("... starting with"). Budgets are non-uniform: one
top-k over every layer and head of the normalized scores (attention probabilities, so
comparable everywhere) sets each layer's budget (budgets.global_layer_counts), and the
heads of a layer share it by score (select_per_head, optional floor / cap): heads keep unequal
counts, packed into one sequence so the cache holds exactly the budget (eviction/slots.pack_heads).

Slots outside the context (the question and the template after it) are always kept;
protected tokens (sinks, system prompt) are set aside first by the Compressor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from workers.attention import attention_weights
from workers.cache import KVCache, LayerKV
from workers.eviction import scores
from workers.eviction.budgets import global_layer_counts, round_counts
from workers.eviction.policies import Policy, ScoreContext, register
from workers.prompt import template_parts

REPEAT_FIRST = "\n\nRepeat the previous context exactly."
REPEAT_NEXT = "\n\nRepeat the part of the previous context exactly, starting with"
OVERLAP_TOKENS = 8  # tokens of the previous piece restated after REPEAT_NEXT
QUERY_ROWS = 256  # reconstruction query rows per attention_weights call (bounds memory)


def group_max(attn: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """attn: [Hq, S, T] -> [Hkv, T]: max over the S queries and the query heads of each GQA group."""
    groups = attn.shape[0] // num_kv_heads
    return attn.reshape(num_kv_heads, groups * attn.shape[1], attn.shape[2]).amax(dim=1)


def visible_layer(kv: LayerKV, sink_tokens: int, start: int, end: int) -> tuple[LayerKV, torch.Tensor | None]:
    """The layer as one reconstruction piece sees it: only the sinks and positions [start, end).

    -> (view, slots): a shared layout is sliced to those slots (slots [S] = their indices in `kv`); a
    per-head layout keeps every slot and masks the others (slots None)."""
    positions = kv.head_positions()
    visible = (positions < sink_tokens) | ((positions >= start) & (positions < end))
    if kv.head_mask is not None or kv.positions.dim() == 2:
        return LayerKV(kv.keys, kv.values, kv.positions, head_mask=visible & kv.valid_mask()), None
    slots = visible[0].nonzero().flatten()
    return LayerKV(kv.keys[:, slots], kv.values[:, slots], kv.positions[slots]), slots


def repeat_prompt(runner, token_ids: list[int], context_start: int, start: int, end: int) -> list[int]:
    """Token ids of the reconstruction of context piece [start, end): instruction, chat turn, the piece."""
    if start == context_start:
        instruction = runner.tokenize(REPEAT_FIRST)
    else:
        instruction = runner.tokenize(REPEAT_NEXT) + token_ids[max(context_start, start - OVERLAP_TOKENS):start]
    turn = runner.tokenize(template_parts(runner.tokenizer, "")[1])  # end of the user turn + generation prompt
    return instruction + turn + list(token_ids[start:end])


@torch.inference_mode()
def reconstruction_scores(runner, cache: KVCache, token_ids: list[int], context: tuple[int, int],
                          sink_tokens: int = 4, piece_tokens: int = 512) -> list[torch.Tensor]:
    """Per layer [Hkv, T] (T = the layer's slots): the max attention each slot of the context receives
    from the reconstruction queries; +inf for slots outside `context` = [start, end) positions (kept).

    token_ids: the prompt's ids by position (the context ones are repeated). The cache is not changed:
    each piece runs over a view of it (sinks + the piece visible), its own K/V appended to the view only.
    """
    start, end = context
    heads = runner.shape.num_kv_heads
    scale = runner.layers[0].self_attn.scaling
    out = []
    for kv in cache.layers:
        positions = kv.head_positions()
        outside = (positions < start) | (positions >= end)
        out.append(torch.zeros(kv.keys.shape[:2], dtype=torch.float32, device=kv.keys.device)
                   .masked_fill(outside, float("inf")))
    for a in range(start, end, piece_tokens):
        b = min(a + piece_tokens, end)
        ids = repeat_prompt(runner, token_ids, start, a, b)
        views = [visible_layer(kv, sink_tokens, a, b) for kv in cache.layers]
        view = KVCache([v for v, _ in views])
        widths = [v.num_tokens for v, _ in views]  # the view's own slots come first; the repeat's K/V follow
        in_piece = [((p := kv.head_positions()) >= a) & (p < b) for kv in cache.layers]

        def observe(layer: int, q: torch.Tensor, q_positions: torch.Tensor, kv: LayerKV) -> None:
            best = torch.zeros(kv.keys.shape[0], widths[layer], dtype=torch.float32, device=kv.keys.device)
            for r in range(0, q.shape[1], QUERY_ROWS):
                rows = slice(r, r + QUERY_ROWS)
                attn = attention_weights(q[:, rows], kv.keys, q_positions[rows], kv.positions, scale, kv.head_mask)
                best = torch.maximum(best, group_max(attn[..., :widths[layer]], heads))
            slots = views[layer][1]
            if slots is not None:  # back to the layer's own slots
                best = torch.zeros_like(out[layer]).index_copy_(1, slots, best)
            out[layer] = torch.where(in_piece[layer], torch.maximum(out[layer], best), out[layer])

        positions = torch.arange(end, end + len(ids), device=runner.device)
        runner.forward(torch.tensor(ids, device=runner.device), positions, view, observer=observe)
    return out


@register("kvzip")
@dataclass
class KVzip(Policy):
    """KVzip: context-reconstruction attention, query-agnostic, non-uniform budgets over layers and heads.

    floor: share of each head's budget it keeps on its own (the paper uses none);
    head_cap: no head keeps more than cap x its layer's budget (None = free, as the paper). Free heads
    keep unequal counts, and the cache packs them (workers/cache.py), so bytes = the budget. Chosen on
    the quality suite's dev split: at budget 0.2, accuracy 0.73 free vs 0.54 with a cap of 1 (equal
    counts) and 0.60 with 1.5; again in the balanced order, 0.75 free vs 0.54 / 0.60 / 0.71 with caps
    of 1 / 1.5 / 2, 0.73 with a floor of 0.2 (research/eviction.md, "KVzip's own allocation");
    layerwise: equal budgets per layer (only the heads of a layer compete), as kvpress' `layerwise`
    (0.50 vs 0.60 on dev's needle families, 0.56 vs 0.75 on balanced dev, so off).
    """

    query_agnostic: ClassVar[bool] = True
    needs_model: ClassVar[bool] = True
    per_head: ClassVar[bool] = True
    floor: float = 0.0
    head_cap: float | None = None
    layerwise: bool = False
    piece_tokens: int = 512

    def prepare_key(self) -> tuple:
        return ("kvzip-reconstruction", self.piece_tokens)  # budgets and head caps only select from the scores

    def prepare(self, runner, cache, token_ids, context, sink_tokens):
        return reconstruction_scores(runner, cache, token_ids, context, sink_tokens, self.piece_tokens)

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        if ctx.prepared is None:
            raise RuntimeError("kvzip scores come from Compressor.prepare(runner, cache, token_ids, context)")
        return ctx.prepared

    def layer_budgets(self, contexts: list[ScoreContext], budget: int) -> list[int] | None:
        """One top-k over the whole cache; each layer's share rounded (largest remainder), so the budgets do
        not depend on anything but the scores (protected and question slots count in every layer alike)."""
        if self.layerwise or any(c.prepared is None for c in contexts):
            return None
        counts = global_layer_counts([c.prepared for c in contexts], [c.protected for c in contexts],
                                     [c.valid for c in contexts], budget)
        return round_counts(counts, budget * len(contexts))


@register("kvzip-snap")
@dataclass
class KVzipSnap(KVzip):
    """KVzip's query-agnostic scores, with a `share` of every head's budget given to SnapKV's choice.

    The reconstruction score keeps what the model needs to restate the context, budgets over layers
    and heads included; SnapKV's pooled attention from the question (the observation window, widened
    to the question in a RAG prompt) picks, per kv head, the top `share` x the layer's free budget,
    which are kept whatever kvzip scored them. A union of the two choices at the same bytes; it reads
    the question, so it is not query-agnostic (no ingest-time compression).
    """

    query_agnostic: ClassVar[bool] = False
    windowed: ClassVar[bool] = True
    share: float = 0.25
    obs_window: int = 32
    kernel: int = 7

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"kvzip-snap: share must be in [0, 1], got {self.share!r}")

    @property
    def queries_needed(self) -> int:
        return self.obs_window

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        base = super().score(ctx)  # [Hkv, T]
        attn = ctx.window_attention()
        picks = round(self.share * ctx.free)
        if attn is None or picks <= 0:
            return base
        question = scores.pooled_window_attention(attn, ctx.num_kv_heads, self.kernel)
        blocked = ~ctx.valid if ctx.protected is None else (~ctx.valid | ctx.protected)
        question = question.masked_fill(blocked, float("-inf"))
        top = torch.topk(question, min(picks, question.shape[1]), dim=1).indices  # [Hkv, picks]
        return base.scatter(1, top, float("inf"))  # invalid and protected slots: select_per_head sets them aside
