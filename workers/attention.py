"""Attention over a KV cache with position-based causal masking (GQA-aware).

The one masking rule: a query at position p sees cached entries at positions in [p - window + 1, p];
`window` is None (every earlier position) except on sliding-window layers (Gemma 3's local layers).

How a set of queries runs is planned once (`plan_attention`, shared across a pass's layers by `PlanMemo`): on
a CPU, each row over exactly its own range of entries in one C call (workers/row_attention.py), in fp32 or, for
the bf16-attention prefill kernel on a CPU with AVX512-BF16, in bf16 arithmetic; elsewhere SDPA, on its causal path, in
query blocks, or under a mask."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workers import row_attention


def visibility_mask(q_positions: torch.Tensor, kv_positions: torch.Tensor,
                    head_mask: torch.Tensor | None, num_heads: int, window: int | None = None) -> torch.Tensor:
    """-> bool [heads or 1, S, T]: query at position p sees cached tokens at positions in [p - window + 1, p].

    kv_positions: [T], or [kv_heads, T] when heads keep different tokens (per-head eviction).
    """
    if kv_positions.dim() == 2:  # [Hkv, T] -> per query head
        groups = num_heads // kv_positions.shape[0]
        kv = kv_positions.repeat_interleave(groups, dim=0)[:, None, :]  # [Hq, 1, T]
        q = q_positions[None, :, None]  # [1, S, 1]
    else:
        kv, q = kv_positions[None, None, :], q_positions[None, :, None]  # [1, 1, T], [1, S, 1]
    mask = kv <= q  # [Hq or 1, S, T]
    if window is not None:
        mask = mask & (kv > q - window)
    if head_mask is not None:  # [kv_heads, T] -> per query head
        groups = num_heads // head_mask.shape[0]
        mask = mask & head_mask.repeat_interleave(groups, dim=0)[:, None, :]  # [Hq, S, T]
    return mask


def increasing(positions: torch.Tensor) -> bool:
    """Whether a cache's positions [T] rise strictly: every plan but the mask needs it."""
    return bool((positions[1:] > positions[:-1]).all())


def causal_padding(q_positions: torch.Tensor, kv_positions: torch.Tensor, window: int | None = None) -> int | None:
    """Rows of dummy queries to put in front of q so that SDPA's causal mask is the position rule, or None.

    When the queries are the newest cached tokens in increasing positions (a prefill over an empty
    cache: 0 rows; a prefill after a reused prefix: the prefix's length), the rule is the plain causal
    mask once the queries are padded to the cache's length, and SDPA's flash kernel skips the masked
    blocks instead of reading a mask (about half the work of a long prefill). Only when the padding
    is small against the queries (a quarter), so it never costs more than it saves. Not when a window
    cuts into the cache (the causal mask has no window)."""
    seq, total = q_positions.numel(), kv_positions.numel()
    pad = total - seq
    if kv_positions.dim() != 1 or seq < 2 or not 0 <= pad <= seq // 4:
        return None
    if window is not None and int(q_positions.max() - kv_positions.min()) >= window:
        return None
    if not torch.equal(kv_positions[pad:], q_positions) or not increasing(kv_positions):
        return None
    return pad


BLOCK_GRAIN = 16  # query blocks are cut at multiples of this many rows (and at the last row)
# what one more SDPA call costs, in key-rows (a query row against one cached entry, all heads): chosen by
# timing blend's prefill through stored chunks at 800 / 1500 / 3000 / 6000 (and fixed 64-row blocks) on the
# AVX512-BF16 box, two alternated runs; 3000 was among the fastest at 0.15, 0.3 and 0.5 in both
# (research/results/2026-12-07-ninth/ab_blocks.py). More than dispatch alone (~25 us, ~1,200 key-rows): a
# block under 33 rows also leaves one of two cores idle part of the time (SDPA splits its work by head)
CALL_COST = 3000
MAX_BLOCK_ROWS = 256  # a block spans at most this many rows: the search stays linear in the rows (and SDPA's
# causal-free path gains nothing from longer blocks: its own query splits are 32-256 rows)


def query_blocks(q_positions: torch.Tensor, kv_positions: torch.Tensor, window: int | None = None,
                 grain: int = BLOCK_GRAIN, call_cost: int = CALL_COST,
                 max_rows: int = MAX_BLOCK_ROWS) -> list[tuple[int, int, int, int]] | None:
    """Blocks of queries, each with the range of cache entries it can see: [(first row, end row, first key,
    end key)], or None.

    When queries are scattered over a long cache (blend's selected tokens), one SDPA call over every
    key computes S x T scores, most of them masked. Cut into blocks in position order, a block needs only
    the keys up to its last query's position (and, under a sliding window, from its first query's window
    start). The cuts (at multiples of `grain` rows, blocks of at most `max_rows`) minimise the key-rows
    computed plus `call_cost` a block (`cheapest_blocks`); None when one call costs no more. Only for one
    position row sorted on both sides."""
    bounds = block_bounds(q_positions, kv_positions, window, grain)
    if bounds is None:
        return None
    return cheapest_blocks(bounds, lambda rows, keys: rows * keys + call_cost, max(1, max_rows // grain))


@dataclass(frozen=True)
class BlockBounds:
    """Where query blocks may start and end: candidate bounds every `grain` rows and what a block between two
    of them sees."""

    cuts: list[int]  # [C] candidate block bounds, in rows: 0, grain, 2 grain, ..., the last row's end
    ends: list[int]  # [C - 1] end key of a block ending at cuts[j + 1] (its last query's position, included)
    firsts: list[int]  # [C - 1] first key of a block starting at cuts[i] (0, or its first query's window start)


def block_bounds(q_positions: torch.Tensor, kv_positions: torch.Tensor, window: int | None,
                 grain: int) -> BlockBounds | None:
    """The candidate bounds, or None where blocks do not apply: per-head positions, at most one grain of
    queries, or positions not sorted on both sides."""
    seq = q_positions.numel()
    if kv_positions.dim() != 1 or seq <= grain or not increasing(kv_positions):
        return None
    if not bool((q_positions[1:] >= q_positions[:-1]).all()):
        return None
    cuts = torch.cat([torch.arange(0, seq, grain), torch.tensor([seq])])
    ends = torch.searchsorted(kv_positions, q_positions[cuts[1:] - 1], right=True).tolist()
    firsts = [0] * (len(cuts) - 1)
    if window is not None:
        firsts = torch.searchsorted(kv_positions, q_positions[cuts[:-1]] - window + 1).tolist()
    return BlockBounds(cuts.tolist(), ends, firsts)


def cheapest_blocks(bounds: BlockBounds, cost, reach: int) -> list[tuple[int, int, int, int]] | None:
    """The blocks (first row, end row, first key, end key) whose summed cost(rows, keys) is least, each
    spanning at most `reach` candidate bounds, by dynamic programming over the bounds; None when one block
    of every row costs no more."""
    cuts, ends, firsts = bounds.cuts, bounds.ends, bounds.firsts
    best, back = [0] + [None] * (len(cuts) - 1), [0] * len(cuts)  # cheapest cost of rows [0, cuts[j])
    for j in range(1, len(cuts)):
        best[j], back[j] = min((best[i] + cost(cuts[j] - cuts[i], ends[j - 1] - firsts[i]), i)
                               for i in range(max(0, j - reach), j))
    if best[-1] >= cost(cuts[-1], ends[-1] - firsts[0]):
        return None
    blocks, j = [], len(cuts) - 1
    while j > 0:
        i = back[j]
        blocks.append((cuts[i], cuts[j], firsts[i], ends[j - 1]))
        j = i
    return blocks[::-1] if len(blocks) > 1 else None


@dataclass(frozen=True)
class AttentionPlan:
    """How `attend` runs one set of query positions over one cache's positions: each row over its own range of
    entries (`ranges`: first and end entry per row, row_attention.c), SDPA's causal path after `pad` zero
    queries, query blocks (`parts`: first row, end row, first key, end key, and the block's own plan), or one
    call under an additive mask (0 where visible, -inf elsewhere: what SDPA makes of a bool mask, so the
    results are the same bit for bit). Made once (`plan_attention`); every layer whose queries, cache
    positions, window and per-head mask are the same runs it (`PlanMemo`)."""

    ranges: tuple[torch.Tensor, torch.Tensor] | None = None  # [S] int32 first and end entry of each row
    bf16: bool = False  # the ranges in bf16 arithmetic (row_attention.bf16_fits), else fp32
    pad: int | None = None
    mask: torch.Tensor | None = None  # [1, Hq or 1, S, T] additive, in the queries' dtype
    parts: tuple[tuple[int, int, int, int, "AttentionPlan"], ...] = ()

    def run(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
        """q: [Hq, S, D]; keys/values: [Hkv, T, D] -> attention output [S, Hq * D]."""
        if self.ranges is not None:
            if row_attention.fits(q.shape[0], keys.shape[0], q.shape[2]):
                bf16 = self.bf16 and row_attention.bf16_fits(q.shape[2])
                return row_attention.attend_rows(q, keys, values, *self.ranges, scale, bf16=bf16)
            return _range_mask_plan(self.ranges, keys.shape[1], q.dtype).run(q, keys, values, scale)
        if self.parts:  # each block of queries over the keys it can see
            return torch.cat([plan.run(q[:, a:b], keys[:, lo:hi], values[:, lo:hi], scale)
                              for a, b, lo, hi, plan in self.parts])
        num_heads, seq, head_dim = q.shape
        if self.pad:  # zero queries in front, their rows dropped: [Hq, pad + S, D]
            q = torch.cat([q.new_zeros(num_heads, self.pad, head_dim), q], dim=1)
        out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=self.mask,
                                             is_causal=self.pad is not None, scale=scale,
                                             enable_gqa=keys.shape[0] != num_heads)  # [1, Hq, S', D]
        out = out[:, :, self.pad:] if self.pad else out  # [1, Hq, S, D]
        return out[0].transpose(0, 1).reshape(seq, num_heads * head_dim)


def _range_mask_plan(ranges: tuple[torch.Tensor, torch.Tensor], entries: int, dtype: torch.dtype) -> AttentionPlan:
    """SDPA under the additive mask of row ranges (row i sees entries [first[i], end[i])): for a head layout the
    row kernel does not take (a head size that is not a multiple of 8)."""
    first, end = (r.long()[:, None] for r in ranges)
    slots = torch.arange(entries, device=first.device)[None]  # [1, T]
    return _mask_plan(((slots >= first) & (slots < end))[None, None], dtype)  # [1, 1, S, T]


def _mask_plan(visible: torch.Tensor, dtype: torch.dtype) -> AttentionPlan:
    """One SDPA call under the additive mask of `visible` (bool, [1, Hq or 1, S, T]): 0 where visible, -inf else."""
    return AttentionPlan(mask=torch.zeros(visible.shape, dtype=dtype, device=visible.device)
                         .masked_fill_(~visible, float("-inf")))


def plan_attention(q_positions: torch.Tensor, kv_positions: torch.Tensor, head_mask: torch.Tensor | None,
                   num_heads: int, window: int | None, dtype: torch.dtype, blocks: bool = True,
                   rows: bool = True, bf16: bool = False) -> AttentionPlan:
    """The cheapest exact way to run the position rule: each row over its own range where the row kernel runs
    (`row_ranges`; `rows=False` plans for SDPA, the reference; `bf16`: in bf16 arithmetic where the CPU has it),
    else SDPA: the causal path when the queries are the newest entries in order (`causal_padding`), query
    blocks over scattered queries (`query_blocks`; not again inside a block: the blocks are the cheapest cuts
    already), else a mask."""
    if rows and head_mask is None and row_attention.usable(dtype, q_positions.device):
        ranges = row_ranges(q_positions, kv_positions, window)
        if ranges is not None:
            return AttentionPlan(ranges=ranges, bf16=bf16)
    pad = causal_padding(q_positions, kv_positions, window) if head_mask is None else None
    if pad is not None:
        return AttentionPlan(pad=pad)
    cuts = query_blocks(q_positions, kv_positions, window=window) if blocks else None
    if cuts is not None:
        return AttentionPlan(parts=tuple(
            (a, b, lo, hi, plan_attention(q_positions[a:b], kv_positions[lo:hi],
                                          None if head_mask is None else head_mask[:, lo:hi], num_heads, window,
                                          dtype, blocks=False, rows=rows, bf16=bf16))
            for a, b, lo, hi in cuts))
    return _mask_plan(visibility_mask(q_positions, kv_positions, head_mask, num_heads, window)[None], dtype)


def row_ranges(q_positions: torch.Tensor, kv_positions: torch.Tensor,
               window: int | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each query's visible entries as one range [first, end) of the cache: (first [S], end [S]) int32, or None
    where they are not one range (per-head positions, positions not increasing) or a query sees nothing."""
    if kv_positions.dim() != 1 or not increasing(kv_positions):
        return None
    end = torch.searchsorted(kv_positions, q_positions, right=True)
    first = torch.zeros_like(end) if window is None else torch.searchsorted(kv_positions, q_positions - window + 1)
    if not bool((end > first).all()):
        return None
    return first.to(torch.int32), end.to(torch.int32)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_positions: torch.Tensor,
           kv_positions: torch.Tensor, scale: float, head_mask: torch.Tensor | None = None,
           window: int | None = None, plan: AttentionPlan | None = None, bf16: bool = False) -> torch.Tensor:
    """q: [Hq, S, D]; keys/values: [Hkv, T, D] -> attention output [S, Hq * D]. `plan`: made for these
    positions, mask, window and arithmetic (PlanMemo), else made here."""
    if plan is None:
        plan = plan_attention(q_positions, kv_positions, head_mask, q.shape[0], window, q.dtype, bf16=bf16)
    return plan.run(q, keys, values, scale)


class PlanMemo:
    """Attention plans for one pass over the layers (blend's recompute): a layer whose query positions and
    cache positions are the very tensors an earlier layer used, with its window and no per-head mask, runs
    that layer's plan. The memo holds the tensors it keys on, so no id is reused while it lives. Made per
    pass, in which no positions tensor is written in place (inference tensors keep no version to check):
    a pass that picks other rows makes a new query-positions tensor."""

    def __init__(self) -> None:
        self._plans: dict[tuple, tuple[torch.Tensor, torch.Tensor, AttentionPlan]] = {}

    def plan(self, q_positions: torch.Tensor, kv_positions: torch.Tensor, head_mask: torch.Tensor | None,
             num_heads: int, window: int | None, dtype: torch.dtype, bf16: bool = False) -> AttentionPlan:
        if head_mask is not None:  # per-layer masks (chunks compressed at ingest): nothing to share
            return plan_attention(q_positions, kv_positions, head_mask, num_heads, window, dtype, bf16=bf16)
        key = (id(q_positions), id(kv_positions), window, num_heads, dtype, bf16)
        hit = self._plans.get(key)
        if hit is None or hit[0] is not q_positions or hit[1] is not kv_positions:
            plan = plan_attention(q_positions, kv_positions, None, num_heads, window, dtype, bf16=bf16)
            hit = (q_positions, kv_positions, plan)
            self._plans[key] = hit
        return hit[2]


def attention_weights(q: torch.Tensor, keys: torch.Tensor, q_positions: torch.Tensor, kv_positions: torch.Tensor,
                      scale: float, head_mask: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """Explicit softmax rows (for scoring and diagnostics). q: [Hq, S, D]; keys: [Hkv, T, D] -> [Hq, S, T]."""
    num_heads = q.shape[0]
    groups = num_heads // keys.shape[0]
    k = keys.repeat_interleave(groups, dim=0).float()  # [Hq, T, D]
    scores = torch.matmul(q.float(), k.transpose(-1, -2)) * scale  # [Hq, S, T]
    mask = visibility_mask(q_positions, kv_positions, head_mask, num_heads, window)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)
