"""Eviction policies: small dataclasses with one `score` method, registered by name.

A policy scores every cached slot of one layer per kv head (higher = keep); the
Compressor sets protected tokens aside, asks for scores, keeps the top ones and
really removes the rest. Allocation variants wrap a scorer (Ada-KV across the
heads of a layer, PyramidKV / DynamicKV across layers) instead of adding flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar, Protocol

import torch

from kvstore.registry import add_unique
from workers.attention import attention_weights
from workers.cache import LayerKV
from workers.eviction import scores
from workers.eviction.budgets import pyramid_weights


class PolicySpec(Protocol):
    """What build_policy reads of a request's compression (workers.requests.CompressionSpec, which checks its
    policy name against this module's registry: so this module does not import it)."""

    policy: str
    window: int | None


@dataclass
class ScoreContext:
    """What a policy may look at for one layer (built by the Compressor from what its observer captured)."""

    layer: int
    kv: LayerKV
    valid: torch.Tensor  # [Hkv, T] bool: real entries (False = padding of a per-head layout)
    queries: torch.Tensor | None  # [Hq, W, D] the last observed queries (RoPE'd), oldest first
    q_positions: torch.Tensor | None  # [W]
    accumulated: torch.Tensor | None  # [Hkv, T] attention summed over every observed query (H2O)
    scale: float
    free: int  # slots per head the policy chooses (budget minus protected)
    protected: torch.Tensor | None = None  # [Hkv, T] bool: set aside before the policy chooses
    prepared: torch.Tensor | None = None  # [Hkv, T] per-slot scores from Policy.prepare (kvzip), following the slots
    _attn: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_kv_heads(self) -> int:
        return self.kv.keys.shape[0]

    def window_attention(self) -> torch.Tensor | None:
        """[Hq, W, T] attention rows of the observed queries over this layer's cache (computed once)."""
        if self._attn is None and self.queries is not None:
            self._attn = attention_weights(self.queries, self.kv.keys, self.q_positions, self.kv.positions,
                                           self.scale, self.kv.head_mask)
        return self._attn

    def positions2d(self) -> torch.Tensor:
        """[Hkv, T] positions (broadcast for a shared layout)."""
        return self.kv.head_positions()

    def recency(self) -> torch.Tensor:
        """[Hkv, T] float score: later position = higher."""
        return self.positions2d().float()

    def boost_recent(self, score: torch.Tensor, window: int) -> torch.Tensor:
        """Force the `window` most recent entries of each head to the top."""
        if window <= 0:
            return score
        recent = self.recency().masked_fill(~self.valid, float("-inf"))
        k = min(window, recent.shape[1])
        idx = torch.topk(recent, k, dim=1).indices
        return score.scatter(1, idx, float("inf"))

    def fallback(self) -> torch.Tensor:
        """Scores when nothing was observed for this layer: keep the most recent."""
        return self.recency()


class Policy:
    """Interface: `score(ctx) -> [Hkv, T]`; class attributes say what the observer must capture.

    `phase` says when the method evicts, as its paper defines it: "prefill" presses (SnapKV, Ada-KV,
    PyramidKV, DynamicKV, CapKV, KVzip) compress the prompt once after prefill and generated tokens are
    appended; "decode" methods (StreamingLLM, H2O, TOVA) keep a fixed budget while decoding. A request's
    `decode_budget` bounds the cache while decoding for either kind.
    `query_agnostic`: the scores do not depend on the question (may compress chunks at ingest).
    """

    name: ClassVar[str] = ""
    phase: ClassVar[str] = "prefill"  # "prefill" | "decode"
    query_agnostic: ClassVar[bool] = False
    needs_model: ClassVar[bool] = False  # scores come from prepare(runner, ...) (a forward pass of its own)
    per_head: ClassVar[bool] = False  # choose per kv head (Ada-KV) instead of one token set per layer
    floor: ClassVar[float] = 0.0  # per-head selection: share of each head's budget it keeps on its own
    head_cap: ClassVar[float | None] = None  # per-head selection: no head keeps more than cap x the layer budget
    rerotate: ClassVar[bool] = False  # decode: keep the window on compact positions (streaming)
    windowed: ClassVar[bool] = False  # an observation window of the newest queries: widened to the question

    @property
    def queries_needed(self) -> int:  # how many of the newest queries per layer to keep
        return 0

    @property
    def accumulates(self) -> bool:  # sum attention over every observed query
        return False

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        raise NotImplementedError

    def layer_weights(self, contexts: list[ScoreContext], budget: int) -> list[float] | None:
        """Relative per-layer budgets (None = equal); `budget` is the mean per-layer budget in tokens."""
        return None

    def layer_budgets(self, contexts: list[ScoreContext], budget: int) -> list[int] | None:
        """Exact integer per-layer budgets (mean `budget`), used instead of layer_weights when given."""
        return None

    def prepare_key(self) -> tuple | None:
        """What prepare()'s scores depend on besides the cache and the prompt (equal keys: the same scores)."""
        return (self.name,) if self.needs_model else None

    def prepare(self, runner, cache, token_ids: list[int], context: tuple[int, int],
                sink_tokens: int) -> list[torch.Tensor] | None:
        """needs_model policies: per layer [Hkv, T] slot scores computed with the model (ctx.prepared)."""
        return None


POLICIES: dict[str, type[Policy]] = {}


def register(name: str):
    def add(cls: type[Policy]) -> type[Policy]:
        add_unique(POLICIES, "policy", name, cls)
        cls.name = name
        return cls
    return add


def build_policy(spec: PolicySpec) -> Policy:
    """A fresh policy instance from the request's spec (`window` goes to policies that have one)."""
    cls = POLICIES[spec.policy]
    kwargs = {}
    if spec.window is not None and "window" in {f.name for f in fields(cls)}:
        kwargs["window"] = spec.window
    return cls(**kwargs)


@register("streaming")
@dataclass
class Streaming(Policy):
    """StreamingLLM (Xiao et al. 2024): attention sinks (protected) + the most recent tokens.

    The recent window is the whole budget minus the protected tokens (spec.window is not used).

    `rerotate`: during decoding, keep the window on compact positions (see layout.compact_positions)
    so generation can run far beyond the model's context; needs the model's RoPE inv_freq.
    """

    phase: ClassVar[str] = "decode"
    rerotate: bool = True

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        return ctx.recency()


@register("h2o")
@dataclass
class H2O(Policy):
    """H2O (Zhang et al. 2023): accumulated attention (heavy hitters) + a recent window.

    Accumulation covers every observed query, prefill and decode. window=None: half the free budget.
    """

    phase: ClassVar[str] = "decode"
    window: int | None = None

    @property
    def accumulates(self) -> bool:
        return True

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        base = ctx.accumulated if ctx.accumulated is not None else ctx.fallback()
        window = self.window if self.window is not None else ctx.free // 2
        return ctx.boost_recent(base.float(), min(window, ctx.free))


@register("tova")
@dataclass
class TOVA(Policy):
    """TOVA (Oren et al. 2024): the newest token's attention, averaged over the heads of a group."""

    phase: ClassVar[str] = "decode"

    @property
    def queries_needed(self) -> int:
        return 1

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        attn = ctx.window_attention()
        return ctx.fallback() if attn is None else scores.newest_query_attention(attn, ctx.num_kv_heads)


@register("snapkv")
@dataclass
class SnapKV(Policy):
    """SnapKV (Li et al. 2024): attention of the last `obs_window` observed queries, 1-D pooled.

    Each kv head keeps its own top tokens (per-head selection, equal counts: floor 1), as in the paper.
    The observation window's own tokens are always kept; in a RAG prompt it is widened to cover the
    question and the template after it (the Compressor's `question_start`). In blend mode the observed
    queries are the recomputed subset; the question at the end is always among them.
    """

    per_head: ClassVar[bool] = True
    floor: ClassVar[float] = 1.0
    windowed: ClassVar[bool] = True
    obs_window: int = 32
    kernel: int = 7
    pool: str = "max"

    @property
    def queries_needed(self) -> int:
        return self.obs_window

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        attn = ctx.window_attention()
        if attn is None:
            return ctx.fallback()
        score = scores.pooled_window_attention(attn, ctx.num_kv_heads, self.kernel, self.pool)
        in_window = torch.isin(ctx.positions2d(), ctx.q_positions) & ctx.valid
        return score.masked_fill(in_window, float("inf"))


@register("capkv")
@dataclass
class CapKV(Policy):
    """Keys with the highest statistical leverage in the key matrix's top-`rank` singular subspace.

    Query-free: ||U^T k_i||^2 / ||k_i||^2 per kv head (scores.key_leverage).
    """

    query_agnostic: ClassVar[bool] = True

    rank: int = 8

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        return scores.key_leverage(ctx.kv.keys, self.rank, ctx.valid)


@dataclass
class Wrapper(Policy):
    """Delegates scoring to another policy; subclasses change only the allocation."""

    scorer: Policy = field(default_factory=SnapKV)

    @property
    def queries_needed(self) -> int:
        return self.scorer.queries_needed

    # what the scorer is, the wrapper is (AdaKV overrides per_head / floor: its allocation is the point)
    phase = property(lambda self: self.scorer.phase)
    query_agnostic = property(lambda self: self.scorer.query_agnostic)
    per_head = property(lambda self: self.scorer.per_head)
    floor = property(lambda self: self.scorer.floor)
    windowed = property(lambda self: self.scorer.windowed)

    @property
    def accumulates(self) -> bool:
        return self.scorer.accumulates

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        return self.scorer.score(ctx)


@register("adakv")
@dataclass
class AdaKV(Wrapper):
    """Ada-KV (Feng et al. 2024): the layer's budget * Hkv entries go to the top scores over all its
    heads, so heads keep unequal numbers of tokens (budgets.select_per_head; layout: per-head compaction)."""

    per_head: ClassVar[bool] = True
    floor: float = 0.2


@register("pyramidkv")
@dataclass
class PyramidKV(Wrapper):
    """PyramidKV (Cai et al. 2024): more slots in low layers, linearly fewer up the stack."""

    beta: float = 20.0

    def layer_weights(self, contexts: list[ScoreContext], budget: int) -> list[float] | None:
        return pyramid_weights(len(contexts), self.beta)


@register("dynamickv")
@dataclass
class DynamicKV(Wrapper):
    """DynamicKV-style: per-layer budgets from how concentrated each layer's attention is at prefill.

    Weight of a layer = effective support exp(entropy) of the observed queries' attention rows
    (scores.effective_support): layers attending to a few tokens give slots to spread ones.
    """

    min_queries: int = 8

    @property
    def queries_needed(self) -> int:
        return max(self.scorer.queries_needed, self.min_queries)

    def layer_weights(self, contexts: list[ScoreContext], budget: int) -> list[float] | None:
        weights = []
        for ctx in contexts:
            attn = ctx.window_attention()
            weights.append(1.0 if attn is None else scores.effective_support(attn))
        return weights
