"""Selection methods no default uses (the product keeps `gradual` and CacheBlend's `deviation`,
workers/selection.py). They register into ragkv's selection registry when imported.

- `legolink`: EPIC's LegoLink (Hu et al., ICML 2025): the first k tokens of every chunk from layer 0
  (each chunk was computed alone, so its first tokens are spurious attention sinks); k = `sink_tokens`,
  else the ratio share of each chunk;
- `legolink-deviation`, `-gradual`, `-attention`, `-chunks`, `-strided`: the first `sink_tokens` of every
  chunk, the rest of the budget by the inner method;
- `attended-deviation`, `attended-gradual`: the chunk tokens the question attends to most (the
  `attention` probe), `attended_share` of the budget, from layer 0; the rest by the inner method;
- `chunks`: whole chunks, the ones the question attends to most, from layer 0;
- `attention`: the chunk tokens the question attends to most, measured by a cheap probe pass of the
  always-computed tokens over the stored KV, then recomputed from layer 0 (A3 / Cache-Craft);
- `strided`: every k-th chunk token from layer 0, k = 1/ratio.

The study that compared them: research/blend.md, "Selection methods". A method's fields that the
product's BlendConfig no longer has (sink_tokens, attended_share, probe_layers) take their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable

import torch

from workers.attention import attention_weights
from workers.selection import Deviation, Gradual, Selection, SelectionContext, select_tokens, selection


def with_forced(ctx: SelectionContext, forced: torch.Tensor) -> SelectionContext:
    """`forced` candidates move to the always-computed set and are paid from the budget."""
    rest = ctx.candidates[~torch.isin(ctx.candidates, forced)]
    always = torch.sort(torch.cat([ctx.always, forced])).values
    return replace(ctx, candidates=rest, always=always, budget=max(0, ctx.budget - forced.numel()))


def chunk_heads(layout, candidates: torch.Tensor, per_chunk: Callable[[int], int]) -> torch.Tensor:
    """The first per_chunk(chunk_len) tokens of every chunk that are candidates: sorted prompt indices."""
    heads = [torch.arange(start, start + min(per_chunk(end - start), end - start)) for start, end in layout.chunk_spans]
    heads = torch.cat(heads).to(candidates.device) if heads else candidates[:0]
    return heads[torch.isin(heads, candidates)]


def question_attention(ctx: SelectionContext, probe_layers: int | None) -> torch.Tensor:
    """-> [prompt_len] attention the question pays to each token, summed over heads, queries and layers.

    A probe pass: only the always-computed tokens run, over the stored KV (plain reuse), for the first
    `probe_layers` layers; the queries of the tokens after the last chunk score every cached token. The
    probe writes K/V of the always-computed tokens only, which the real pass overwrites."""
    runner, layout, cache = ctx.runner, ctx.layout, ctx.cache
    device = ctx.always.device
    score = torch.zeros(layout.num_tokens, device=device)
    rows = (ctx.always >= layout.suffix_start).nonzero().flatten()

    def observe(layer, q, q_positions, kv):
        weights = attention_weights(q[:, rows], kv.keys, q_positions[rows], kv.positions,
                                    runner.layers[layer].self_attn.scaling, kv.head_mask)  # [Hq, Q, T]
        score[: weights.shape[-1]] += weights.sum(dim=(0, 1))

    hidden = runner.embed(torch.tensor(layout.token_ids, device=device)[ctx.always])
    for layer in range(probe_layers or runner.shape.num_layers):
        hidden = runner.layer_forward(layer, hidden, ctx.always, cache, slots=ctx.always, observer=observe)
    return score


def probe_cost(ctx: SelectionContext, probe_layers: int | None) -> int:
    """Token-layers of `question_attention`'s probe: the always-computed tokens through its layers."""
    return ctx.always.numel() * (probe_layers or ctx.runner.shape.num_layers)


@selection("legolink")
@dataclass(frozen=True)
class LegoLink(Selection):
    """The first k tokens of every chunk from layer 0: k = sink_tokens, else round(ratio * chunk length)."""
    sink_tokens: int | None = None

    def start(self, ctx):
        share = ctx.budget / ctx.candidates.numel() if ctx.candidates.numel() else 0.0
        k = (lambda n: self.sink_tokens) if self.sink_tokens is not None else (lambda n: int(round(share * n)))
        return torch.sort(torch.cat([ctx.always, chunk_heads(ctx.layout, ctx.candidates, k)])).values


@selection("strided")
@dataclass(frozen=True)
class Strided(Selection):
    """Every k-th chunk token from layer 0, k = 1/ratio, counted over all chunks: an even sample that puts
    recomputed tokens in every chunk."""

    def start(self, ctx):
        if ctx.budget == 0 or ctx.candidates.numel() == 0:
            return ctx.always
        step = ctx.candidates.numel() / ctx.budget
        picked = ctx.candidates[(torch.arange(ctx.budget, device=ctx.candidates.device) * step).long()]
        return torch.sort(torch.cat([picked, ctx.always])).values


@dataclass(frozen=True)
class WithForced(Selection):
    """A hybrid: `forced(ctx)` candidates run from layer 0, paid from the budget; the inner method picks the
    rest of the budget from the other chunk tokens. Subclasses add their fields, named as in BlendConfig."""
    inner: Selection

    @classmethod
    def wrapping(cls, inner: type[Selection]) -> type[Selection]:
        def from_config(config):
            own = {f.name: getattr(config, f.name) for f in fields(cls)[1:] if hasattr(config, f.name)}
            return cls(inner.from_config(config), **own)
        return type(f"{cls.__name__.removeprefix('With')}{inner.__name__}", (cls,),
                    {"from_config": staticmethod(from_config)})

    def forced(self, ctx: SelectionContext) -> torch.Tensor:
        raise NotImplementedError

    def extra_forced_layers(self, ctx: SelectionContext) -> int:
        """Token-layers `forced` runs outside the blend loop."""
        return 0

    def _ctx(self, ctx):
        return with_forced(ctx, self.forced(ctx))

    def start(self, ctx):
        return self.inner.start(self._ctx(ctx))

    def keep(self, layer, ctx, hidden, active):
        return self.inner.keep(layer, self._ctx(ctx), hidden, active)

    def extra_token_layers(self, ctx):
        return self.extra_forced_layers(ctx) + self.inner.extra_token_layers(self._ctx(ctx))


@dataclass(frozen=True)
class WithSinks(WithForced):
    """The first `sink_tokens` (default 4) of every chunk, capped by each chunk's budget share."""
    sink_tokens: int | None = None

    def forced(self, ctx):
        share = ctx.budget / ctx.candidates.numel() if ctx.candidates.numel() else 0.0
        k = 4 if self.sink_tokens is None else self.sink_tokens
        return chunk_heads(ctx.layout, ctx.candidates, lambda n: min(k, int(round(share * n))))


@dataclass(frozen=True)
class WithAttended(WithForced):
    """The chunk tokens the question attends to most (the `attention` probe), `attended_share` of the budget."""
    attended_share: float = 0.33
    probe_layers: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.attended_share <= 1.0:
            raise ValueError(f"attended_share must be in [0, 1], got {self.attended_share!r}")

    def _count(self, ctx) -> int:
        return int(round(self.attended_share * ctx.budget))

    def forced(self, ctx):
        if "attended" not in ctx.memo:  # the probe runs once a prompt, and only when it picks anything
            count = self._count(ctx)
            ctx.memo["attended"] = (select_tokens(question_attention(ctx, self.probe_layers), ctx.candidates, count)
                                    if count else ctx.candidates[:0])
        return ctx.memo["attended"]

    def extra_forced_layers(self, ctx):
        return probe_cost(ctx, self.probe_layers) if self._count(ctx) else 0


@selection("attention")
@dataclass(frozen=True)
class QuestionAttention(Selection):
    probe_layers: int | None = None  # None = every layer

    def start(self, ctx):
        if ctx.budget == 0:
            return ctx.always
        picked = select_tokens(question_attention(ctx, self.probe_layers), ctx.candidates, ctx.budget)
        return torch.sort(torch.cat([picked, ctx.always])).values

    def extra_token_layers(self, ctx):
        return 0 if ctx.budget == 0 else probe_cost(ctx, self.probe_layers)


@selection("chunks")
@dataclass(frozen=True)
class AttendedChunks(QuestionAttention):
    """Whole chunks, those the question attends to most (the probe of `attention`, each chunk's first
    `sink_tokens` (default 4) left out of its score), recomputed from layer 0 until the budget is spent;
    the last chunk taken is cut to its most attended tokens. The probe's cost is `attention`'s."""
    sink_tokens: int | None = None

    def start(self, ctx):
        if ctx.budget == 0:
            return ctx.always
        attention = question_attention(ctx, self.probe_layers)
        score = chunk_scores(ctx.layout, attention, 4 if self.sink_tokens is None else self.sink_tokens)
        picked = select_tokens(score + attention / (attention.max() + 1e-9), ctx.candidates, ctx.budget)
        return torch.sort(torch.cat([picked, ctx.always])).values


def chunk_scores(layout, attention: torch.Tensor, skip: int) -> torch.Tensor:
    """-> [prompt_len]: each chunk token gets its chunk's rank (1 = least attended chunk, N = most), by the
    attention [prompt_len] its tokens after the first `skip` receive; 0 outside chunks."""
    mass = torch.stack([attention[start + min(skip, end - start - 1):end].sum() for start, end in layout.chunk_spans])
    ranks = torch.empty_like(mass)
    ranks[torch.argsort(mass)] = torch.arange(1, mass.numel() + 1, dtype=mass.dtype, device=mass.device)
    score = torch.zeros_like(attention)
    for (start, end), rank in zip(layout.chunk_spans, ranks):
        score[start:end] = rank
    return score


selection("legolink-deviation")(WithSinks.wrapping(Deviation))
selection("legolink-gradual")(WithSinks.wrapping(Gradual))
selection("legolink-attention")(WithSinks.wrapping(QuestionAttention))
selection("legolink-chunks")(WithSinks.wrapping(AttendedChunks))
selection("legolink-strided")(WithSinks.wrapping(Strided))
selection("attended-deviation")(WithAttended.wrapping(Deviation))
selection("attended-gradual")(WithAttended.wrapping(Gradual))
