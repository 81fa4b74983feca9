"""Selection methods for CacheBlend: which stored chunk tokens are recomputed, and from which layer.

A method is a small frozen dataclass behind one interface, registered by name
(`@selection("name")`), built from a `BlendConfig` (`make_selection`). The
blend loop (workers/blend.py) asks it two things:

- `start(ctx)`: the prompt indices whose hidden states enter layer 0;
- `keep(layer, ctx, hidden, active)`: before `layer`, the subset of `active`
  that goes on (None = all of it). Tokens dropped here keep their stored K/V
  from `layer` on; tokens kept get fresh K/V written over the stored ones.

Every method spends the same budget, `round(ratio * chunk tokens)` recomputed
chunk tokens, so `blend:METHOD@RATIO` compares methods at equal recompute.
At ratio 1 every method recomputes every token at every layer (= full prefill);
at ratio 0 only the always-computed tokens run after layer 0.

Methods:
- `deviation`: CacheBlend's one-shot choice: the tokens whose fresh K/V deviate
  most from the stored ones at `check_layer` (Yao et al., 2024);
- `gradual`: CacheBlend's gradual filtering: a wider set at `check_layer`,
  re-measured and narrowed layer by layer down to the budget;
- `legolink`: EPIC's LegoLink (Hu et al., ICML 2025): the first k tokens of every
  chunk from layer 0 (each chunk was computed alone, so its first tokens are
  spurious attention sinks); k = `sink_tokens`, else the ratio share of each chunk;
- `legolink-deviation`, `legolink-gradual`, `legolink-attention`, `legolink-chunks`: the first
  `sink_tokens` of every chunk, the rest of the budget by the inner method;
- `attended-deviation`, `attended-gradual`: the chunk tokens the question attends to most (the
  `attention` probe), `attended_share` of the budget, from layer 0; the rest by the inner method;
- `chunks`: whole chunks, the ones the question attends to most (the `attention` probe), from layer 0;
- `attention`: the chunk tokens the question attends to most, measured by a cheap
  probe pass of the always-computed tokens over the stored KV, then recomputed from
  layer 0 (question-guided selection, as in A3 / Cache-Craft's focus on attended tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Callable

import torch

from kvstore.registry import registrar
from workers.attention import attention_weights

if TYPE_CHECKING:
    from workers.blend import BlendConfig


@dataclass(frozen=True)
class SelectionContext:
    runner: object
    layout: object  # PromptLayout
    cache: object  # KVCache, the fused one
    candidates: torch.Tensor  # [C] sorted prompt indices of stored chunk tokens the method may pick from
    always: torch.Tensor  # [A] sorted prompt indices that run through every layer
    budget: int  # how many candidates to recompute
    memo: dict = field(default_factory=dict, compare=False, repr=False)  # what a method computes once a prompt

    @property
    def everything(self) -> torch.Tensor:
        """Every non-prefix token, sorted."""
        return torch.sort(torch.cat([self.candidates, self.always])).values

    def with_forced(self, forced: torch.Tensor) -> "SelectionContext":
        """`forced` candidates move to the always-computed set and are paid from the budget."""
        rest = self.candidates[~torch.isin(self.candidates, forced)]
        always = torch.sort(torch.cat([self.always, forced])).values
        return replace(self, candidates=rest, always=always, budget=max(0, self.budget - forced.numel()))


@dataclass(frozen=True)
class Selection:
    """Base: nothing is picked (plain reuse: only the always-computed tokens run)."""

    @classmethod
    def from_config(cls, config: "BlendConfig") -> "Selection":
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})

    def start(self, ctx: SelectionContext) -> torch.Tensor:
        return ctx.always

    def keep(self, layer: int, ctx: SelectionContext, hidden: torch.Tensor, active: torch.Tensor):
        return None

    def extra_token_layers(self, ctx: SelectionContext) -> int:
        """Token-layers the method runs outside the blend loop (a probe pass), for the cost figure."""
        return 0


SELECTIONS: dict[str, type[Selection]] = {}
# the layer whose fresh-vs-stored K/V deviation picks the tokens (layers before it run for every token).
# Layer-0 K/V do not depend on context; 2 answered 5 more of 96 `dev` prompts than 1 with `doc` chunks
# (docs/blend.md, "Why check layer 2")
CHECK_LAYER = 2


selection = registrar(SELECTIONS, "selection method")  # a name registered twice is an error at import


def make_selection(config: "BlendConfig") -> Selection:
    """The config's method (BlendConfig checked the name against SELECTIONS when it was made)."""
    return SELECTIONS[config.method].from_config(config)


# -- math ------------------------------------------------------------------------


def kv_deviation(fresh_k: torch.Tensor, fresh_v: torch.Tensor, old_k: torch.Tensor, old_v: torch.Tensor,
                 measure: str) -> torch.Tensor:
    """Per-token deviation; all inputs [kv_heads, T, D] -> [T]. Relative L2, summed over heads."""
    def rel(fresh, old):
        return ((fresh - old).float().norm(dim=-1) / (old.float().norm(dim=-1) + 1e-6)).sum(dim=0)

    if measure == "k":
        return rel(fresh_k, old_k)
    if measure == "v":
        return rel(fresh_v, old_v)
    if measure == "kv":
        return rel(fresh_k, old_k) + rel(fresh_v, old_v)
    raise ValueError(f"deviation measure must be 'k', 'v' or 'kv', got {measure!r}")


def select_tokens(score: torch.Tensor, candidates: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` candidates (prompt indices) with the largest score [prompt_len or more], sorted."""
    count = min(int(count), candidates.numel())
    if count <= 0:
        return candidates[:0]
    top = torch.topk(score[candidates], k=count).indices
    return torch.sort(candidates[top]).values


def fresh_deviation(ctx: SelectionContext, layer: int, hidden: torch.Tensor, active: torch.Tensor,
                    measure: str) -> torch.Tensor:
    """-> [prompt_len] deviation of fresh vs stored K/V at `layer` for the active candidates (0 elsewhere).

    hidden: [len(active), hidden] layer input of the `active` (sorted) prompt indices."""
    runner, kv = ctx.runner, ctx.cache.layers[layer]
    tokens = ctx.candidates[torch.isin(ctx.candidates, active)]
    score = torch.zeros(ctx.layout.num_tokens, device=active.device)
    if tokens.numel() == 0:
        return score
    rows = torch.searchsorted(active, tokens)
    _, fresh_k, fresh_v = runner.qkv(layer, runner.layers[layer].input_layernorm(hidden[rows]), tokens)
    old_k, old_v = kv.keys[:, tokens], kv.values[:, tokens]
    if kv.head_mask is not None:  # chunks compressed at ingest: a head that dropped a token has nothing to compare
        held = kv.head_mask[:, tokens, None]
        fresh_k, fresh_v = torch.where(held, fresh_k, old_k), torch.where(held, fresh_v, old_v)
    score[tokens] = kv_deviation(fresh_k, fresh_v, old_k, old_v, measure)
    return score


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


def everything_to_choose(ctx: SelectionContext) -> torch.Tensor:
    """What a deviation method starts with: every token runs the layers before the check layer, so that
    their fresh K/V there can be compared; with no budget there is nothing to choose, and only the
    always-computed tokens run (= plain reuse at any check layer)."""
    return ctx.everything if ctx.budget > 0 else ctx.always


# -- methods ---------------------------------------------------------------------


@selection("deviation")
@dataclass(frozen=True)
class Deviation(Selection):
    check_layer: int = CHECK_LAYER
    deviation: str = "kv"

    def start(self, ctx):
        return everything_to_choose(ctx)

    def keep(self, layer, ctx, hidden, active):
        if layer != self.check_layer:
            return None
        picked = select_tokens(fresh_deviation(ctx, layer, hidden, active, self.deviation), ctx.candidates,
                               ctx.budget)
        return torch.sort(torch.cat([picked, ctx.always])).values


@selection("gradual")
@dataclass(frozen=True)
class Gradual(Selection):
    """Keep `gradual_widen` x the budget at `check_layer`, shrink geometrically to the budget over
    `gradual_steps` layers, re-measuring the deviation among the survivors at each."""
    check_layer: int = CHECK_LAYER
    deviation: str = "kv"
    gradual_widen: float = 3.0
    gradual_steps: int = 3

    def count_at(self, layer: int, ctx) -> int | None:
        step = layer - self.check_layer
        if not 0 <= step < self.gradual_steps:
            return None
        if ctx.budget == 0:
            return 0
        widen = self.gradual_widen ** (1 - step / max(1, self.gradual_steps - 1)) if self.gradual_steps > 1 else 1.0
        return min(ctx.candidates.numel(), int(round(ctx.budget * widen)))

    def start(self, ctx):
        return everything_to_choose(ctx)

    def keep(self, layer, ctx, hidden, active):
        count = self.count_at(layer, ctx)
        if count is None:
            return None
        score = fresh_deviation(ctx, layer, hidden, active, self.deviation)
        picked = select_tokens(score, ctx.candidates[torch.isin(ctx.candidates, active)], count)
        return torch.sort(torch.cat([picked, ctx.always])).values


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
    recomputed tokens in every chunk (what the drift repair, workers/drift.py, measures each chunk's drift on)."""

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
            return cls(inner.from_config(config), **{f.name: getattr(config, f.name) for f in fields(cls)[1:]})
        return type(f"{cls.__name__.removeprefix('With')}{inner.__name__}", (cls,),
                    {"from_config": staticmethod(from_config)})

    def forced(self, ctx: SelectionContext) -> torch.Tensor:
        raise NotImplementedError

    def extra_forced_layers(self, ctx: SelectionContext) -> int:
        """Token-layers `forced` runs outside the blend loop."""
        return 0

    def _ctx(self, ctx):
        return ctx.with_forced(self.forced(ctx))

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
