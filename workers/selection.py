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
  re-measured and narrowed layer by layer down to the budget.

Other methods (EPIC's LegoLink, question attention, whole chunks, strided, hybrids) are research: they
register themselves from research/ragkv_research/selection.py when research is installed (kvstore/plugins.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from kvstore.registry import Registry, registrar


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


@dataclass(frozen=True)
class Selection:
    """Base: nothing is picked (plain reuse: only the always-computed tokens run)."""

    @classmethod
    def from_config(cls, config) -> "Selection":
        """Built from a blend setting (workers.blend.BlendConfig): the fields it shares with it, else defaults."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)})

    def start(self, ctx: SelectionContext) -> torch.Tensor:
        return ctx.always

    def keep(self, layer: int, ctx: SelectionContext, hidden: torch.Tensor, active: torch.Tensor):
        return None

    def extra_token_layers(self, ctx: SelectionContext) -> int:
        """Token-layers the method runs outside the blend loop (a probe pass), for the cost figure."""
        return 0


SELECTIONS: Registry = Registry()  # name -> type[Selection]; plug-ins (research/) may add more
# the layer whose fresh-vs-stored K/V deviation picks the tokens (layers before it run for every token).
# Layer-0 K/V do not depend on context; 2 answered 5 more of 96 `dev` prompts than 1 with `doc` chunks
# (research/blend.md, "Why check layer 2")
CHECK_LAYER = 2


selection = registrar(SELECTIONS, "selection method")  # a name registered twice is an error at import


def make_selection(config) -> Selection:
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
    # index_select: the rows x[index] gathers, without advanced indexing's CPU cost (6-8x at these sizes)
    fresh_k, fresh_v = runner.kv(layer, runner.layers[layer].input_layernorm(hidden.index_select(0, rows)), tokens)
    old_k, old_v = kv.keys.index_select(1, tokens), kv.values.index_select(1, tokens)
    if kv.head_mask is not None:  # chunks compressed at ingest: a head that dropped a token has nothing to compare
        held = kv.head_mask[:, tokens, None]
        fresh_k, fresh_v = torch.where(held, fresh_k, old_k), torch.where(held, fresh_v, old_v)
    score[tokens] = kv_deviation(fresh_k, fresh_v, old_k, old_v, measure)
    return score


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
