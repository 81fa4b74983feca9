"""Compressor: captures what a policy needs during prefill/decode, evicts to budget, reports the cost.

Life cycle (one request):
    compressor = make_compressor(spec, shape, prefix_len, prompt_len, question_start=...)
    runner.forward(ids, positions, cache, observer=compressor.observer)   # prefill
    compressor.prepare(runner, cache, token_ids, context)                 # kvzip: its own scoring pass
    compressor.compress(cache)                                            # evict to budget
    decode(..., hooks=compressor.decode_hooks())                          # append, or stay at a budget

Decoding follows the policy's paper (Policy.phase): a prefill press appends the generated
tokens; a decode-time method keeps the cache at its budget. `spec.decode_budget` sets the
decode-time bound explicitly (for either kind); per-layer budgets are scaled to it.

The observer keeps, per layer, the newest queries (the observation window:
whatever queries were observed, e.g. only the recomputed subset in blend mode)
and, for H2O, the attention summed over every observed query. Per-slot state
(accumulated attention, protection) follows the slots through every eviction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstore.rope import layer_freq
from workers.attention import attention_weights
from workers.cache import KVCache, LayerKV
from workers.eviction import scores
from workers.eviction.budgets import allocate, protected_mask, select_kept_tokens, select_per_head
from workers.eviction.policies import Policy, ScoreContext
from workers.eviction.slots import compact_positions, gather_slots, keep_slots, pack_heads, unpack_heads
from workers.generate import DecodeHooks
from workers.requests import CompressionSpec

DIAGNOSTIC_QUERIES = 8  # newest queries per layer used for the L1 loss / bound
ACCUMULATE_CHUNK = 256  # query rows per attention_weights call when accumulating (bounds memory)


@dataclass
class LayerState:
    queries: torch.Tensor | None = None  # [Hq, W, D] newest observed queries, by position
    q_positions: torch.Tensor | None = None  # [W]
    accumulated: torch.Tensor | None = None  # [Hkv, T] (H2O)
    prepared: torch.Tensor | None = None  # [Hkv, T] scores from Policy.prepare (kvzip); appended slots get +inf
    protected: torch.Tensor | None = None  # [Hkv, T] bool, set at the first eviction


def _pad_slots(x: torch.Tensor | None, slots: int, fill) -> torch.Tensor | None:
    """x: [Hkv, T'] -> [Hkv, slots], new slots (appended tokens) set to `fill`."""
    if x is None or x.shape[1] >= slots:
        return x
    pad = torch.full((x.shape[0], slots - x.shape[1]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=1)


def _unpack(cache: KVCache) -> None:
    """Packed layers (a blend over chunks compressed at ingest) back to the padded per-head layout the
    policies score."""
    cache.layers[:] = [unpack_heads(kv) for kv in cache.layers]


class Compressor:
    def __init__(self, policy: Policy | None, spec: CompressionSpec, num_layers: int, head_dim: int,
                 prefix_len: int, prompt_len: int, budget: int, inv_freq: torch.Tensor | None = None,
                 scale: float | None = None, decode_budget: int | None = None, question_tokens: int = 0,
                 pack: bool = False):
        self.policy = policy
        self.spec = spec
        self.num_layers = num_layers
        self.prefix_len = prefix_len if spec.protect_system_prompt else 0
        self.prompt_len = prompt_len
        self.budget = budget
        self.inv_freq = inv_freq
        self.scale = scale if scale is not None else head_dim ** -0.5
        # windowed policies observe at least the question (and the template after it) in a RAG prompt
        self.queries = 0 if policy is None else max(policy.queries_needed,
                                                     question_tokens if policy.windowed else 0)
        self.window = max(self.queries, DIAGNOSTIC_QUERIES) if policy is not None else 0
        # None: decode appends (a prefill press with no explicit decode budget)
        self.decode_budget = decode_budget if decode_budget is not None else (
            budget if policy is not None and policy.phase == "decode" else None)
        # a per-head result is packed (bytes = the entries kept) when nothing evicts from it later
        self.packs = pack and self.decode_budget is None
        self.layer_budgets: list[int] | None = None
        self._decode_budgets: list[int] | None = None
        self._states = [LayerState() for _ in range(num_layers)]
        self._stats: dict = {"policy": spec.policy, "budget_tokens": budget, "prompt_tokens": prompt_len}
        self._decode_evictions = 0
        self._max_cache_tokens = 0

    # -- observation --------------------------------------------------------
    def observer(self, layer: int, q: torch.Tensor, q_positions: torch.Tensor, kv: LayerKV) -> None:
        """AttentionObserver: q [Hq, S, D] at q_positions [S] attending over the layer's kv."""
        if self.policy is None:
            return
        state = self._states[layer]
        if self.window:
            queries = q if state.queries is None else torch.cat([state.queries, q], dim=1)
            positions = q_positions if state.q_positions is None else torch.cat([state.q_positions, q_positions])
            order = torch.argsort(positions, stable=True)[-self.window:]
            state.queries, state.q_positions = queries[:, order], positions[order]
        if self.policy.accumulates:
            acc = _pad_slots(state.accumulated, kv.num_tokens, 0.0)
            if acc is None:
                acc = torch.zeros(kv.keys.shape[:2], dtype=torch.float32, device=kv.keys.device)
            for start in range(0, q.shape[1], ACCUMULATE_CHUNK):
                rows = slice(start, start + ACCUMULATE_CHUNK)
                attn = attention_weights(q[:, rows], kv.keys, q_positions[rows], kv.positions, self.scale, kv.head_mask)
                acc = acc + scores.accumulated_attention(attn, kv.keys.shape[0])
            state.accumulated = acc

    def _context(self, layer: int, kv: LayerKV, queries: int) -> ScoreContext:
        state = self._states[layer]
        use = state.queries is not None and queries > 0
        return ScoreContext(
            layer=layer, kv=kv, valid=kv.valid_mask(),
            queries=state.queries[:, -queries:] if use else None,
            q_positions=state.q_positions[-queries:] if use else None,
            accumulated=_pad_slots(state.accumulated, kv.num_tokens, 0.0), scale=self.scale, free=0,
            protected=self._protected(layer, kv), prepared=_pad_slots(state.prepared, kv.num_tokens, float("inf")))

    def _protected(self, layer: int, kv: LayerKV) -> torch.Tensor:
        """[Hkv, T] protected entries; computed from logical positions the first time, then carried."""
        state = self._states[layer]
        if state.protected is None:
            state.protected = protected_mask(kv.head_positions(), self.spec.sink_tokens, self.prefix_len,
                                             self.spec.protected_spans) & kv.valid_mask()
        state.protected = _pad_slots(state.protected, kv.num_tokens, False)
        return state.protected

    # -- planning -----------------------------------------------------------
    def _budgets(self, cache: KVCache, contexts: list[ScoreContext]) -> list[int]:
        if self.layer_budgets is None:
            exact = self.policy.layer_budgets(contexts, self.budget)
            weights = None if exact is not None else self.policy.layer_weights(contexts, self.budget)
            if exact is not None:
                self.layer_budgets = exact
            elif weights is None:
                self.layer_budgets = [self.budget] * self.num_layers
            else:
                lower = [int(self._protected(i, cache.layers[i]).sum(dim=1).max()) for i in range(self.num_layers)]
                upper = [max(cache.layers[i].num_tokens, self.budget) for i in range(self.num_layers)]
                self.layer_budgets = allocate(weights, self.budget, lower, upper)
        return self.layer_budgets

    def _select(self, ctx: ScoreContext, protected: torch.Tensor, budget: int) -> torch.Tensor:
        """-> keep [Hkv, T] bool."""
        ctx.free = max(0, budget - int(protected.sum(dim=1).max()))
        score = self.policy.score(ctx)  # [Hkv, T]
        if self.policy.per_head or ctx.kv.positions.dim() == 2:
            return select_per_head(score, protected, ctx.valid, budget, self.policy.floor, self.policy.head_cap)
        token_score = torch.nan_to_num(score.float().mean(dim=0), nan=0.0)
        keep = select_kept_tokens(token_score, protected[0], budget)
        return keep[None].expand_as(protected)

    def _over_budget(self, kv: LayerKV, budget: int) -> bool:
        if self.policy.per_head or kv.positions.dim() == 2:
            return int(kv.valid_mask().sum()) > budget * kv.keys.shape[0]
        return kv.num_tokens > budget

    @torch.inference_mode()
    def plan(self, cache: KVCache) -> list[torch.Tensor]:
        """Keep masks [Hkv, T] per layer (no change to the cache)."""
        if self.policy is None:
            return [kv.valid_mask() for kv in cache.layers]
        _unpack(cache)
        queries = self.queries
        contexts = [self._context(i, cache.layers[i], queries) for i in range(self.num_layers)]
        budgets = self._budgets(cache, contexts)
        return [self._select(ctx, self._protected(i, ctx.kv), budgets[i]) for i, ctx in enumerate(contexts)]

    def _apply(self, cache: KVCache, layer: int, keep: torch.Tensor) -> None:
        state = self._states[layer]
        kv = cache.layers[layer]
        new_kv, idx, valid = keep_slots(kv, keep)
        state.protected = gather_slots(self._protected(layer, kv), idx) & valid
        if state.accumulated is not None:
            state.accumulated = gather_slots(_pad_slots(state.accumulated, kv.num_tokens, 0.0), idx) * valid
        if state.prepared is not None:
            state.prepared = gather_slots(_pad_slots(state.prepared, kv.num_tokens, float("inf")), idx)
        cache.layers[layer] = new_kv

    # -- public -------------------------------------------------------------
    @property
    def prepare_key(self) -> tuple | None:
        """What prepare()'s scores depend on besides the cache: compressors with equal keys share them."""
        key = None if self.policy is None else self.policy.prepare_key()
        return None if key is None else key + (self.spec.sink_tokens,)

    @torch.inference_mode()
    def prepare(self, runner, cache: KVCache, token_ids: list[int], context: tuple[int, int],
                scores: list[torch.Tensor] | None = None) -> list[torch.Tensor] | None:
        """Policies that score with a pass of their own (kvzip: context reconstruction) run it here,
        after prefill and before compress(). context: [start, end) positions the scores cover.
        `scores`: that pass's result for this very cache, from another compressor (not recomputed).
        Returns the scores (None for other policies)."""
        if self.policy is None or not self.policy.needs_model:
            return None
        scores_ = scores if scores is not None else self.policy.prepare(runner, cache, token_ids, context,
                                                                         self.spec.sink_tokens)
        for state, layer_scores in zip(self._states, scores_):
            state.prepared = layer_scores
        return scores_

    @torch.inference_mode()
    def compress(self, cache: KVCache, keeps: list[torch.Tensor] | None = None) -> dict:
        """Evict to budget after prefill (to `keeps` when given: a plan() of this cache);
        returns stats (bytes before/after, evicted, L1 loss / bound)."""
        before = cache.nbytes()
        slots_before = [int(kv.valid_mask().sum()) for kv in cache.layers]
        losses, bounds = [], []
        keeps = self.plan(cache) if keeps is None else keeps
        for i, keep in enumerate(keeps):
            kv = cache.layers[i]
            if self.policy is not None and self._states[i].queries is not None:
                ctx = self._context(i, kv, DIAGNOSTIC_QUERIES)
                loss, bound = scores.eviction_l1(ctx.window_attention(), kv.values, keep)
                losses.append(loss.mean())
                bounds.append(bound.mean())
            if not bool(keep.all()):
                self._apply(cache, i, keep)
        heads = cache.layers[0].keys.shape[0]
        kept = [int(kv.valid_mask().sum()) for kv in cache.layers]
        protected = int(self._protected(0, cache.layers[0])[0].sum()) if self.policy is not None else 0
        self._max_cache_tokens = max(kv.num_tokens for kv in cache.layers)  # the longest head
        if self.packs:
            cache.layers[:] = [pack_heads(kv) for kv in cache.layers]
        after = cache.nbytes()
        self._stats.update(
            protected_tokens=protected, packed=any(kv.packed for kv in cache.layers),
            kv_bytes_before=before, kv_bytes_after=after, kv_bytes_ratio=after / before if before else 1.0,
            evicted=sum(b - k for b, k in zip(slots_before, kept)) / (heads * len(kept)),
            kept_tokens=[k / heads for k in kept], layer_budgets=list(self.layer_budgets or []),
            l1_loss=float(torch.stack(losses).mean()) if losses else 0.0,
            l1_bound=float(torch.stack(bounds).mean()) if bounds else 0.0,
        )
        return self.stats()

    def _decode_layer_budgets(self, cache: KVCache) -> list[int]:
        """The prefill layer budgets, scaled to the decode budget (each at least its protected count)."""
        if self._decode_budgets is None:
            budgets = self.layer_budgets or self._budgets(
                cache, [self._context(j, cache.layers[j], self.queries) for j in range(self.num_layers)])
            if self.decode_budget == self.budget:
                self._decode_budgets = list(budgets)
            else:
                lower = [int(self._protected(i, cache.layers[i]).sum(dim=1).max()) for i in range(self.num_layers)]
                upper = [max(b, self.decode_budget) * 4 for b in budgets]
                self._decode_budgets = allocate([float(b) for b in budgets], self.decode_budget, lower, upper)
        return self._decode_budgets

    @torch.inference_mode()
    def after_step(self, cache: KVCache) -> None:
        """Decode hook: evict whatever exceeds each layer's decode budget (the newest token's slot included)."""
        if self.policy is None or self.decode_budget is None:
            return
        _unpack(cache)
        queries = self.queries
        budgets = self._decode_layer_budgets(cache)
        for i, kv in enumerate(cache.layers):
            if self._over_budget(kv, budgets[i]):
                ctx = self._context(i, kv, queries)
                self._apply(cache, i, self._select(ctx, self._protected(i, kv), budgets[i]))
                self._decode_evictions += 1
            if self.inv_freq is not None and self.policy.rerotate:
                kv = cache.layers[i]
                if kv.positions.dim() == 1 and int(kv.positions.max() - kv.positions.min()) + 1 > 2 * kv.num_tokens:
                    cache.layers[i] = compact_positions(kv, layer_freq(self.inv_freq, i))
        self._max_cache_tokens = max(self._max_cache_tokens, max(kv.num_tokens for kv in cache.layers))

    def decode_hooks(self) -> DecodeHooks:
        """Appending (a prefill press, no decode budget): no hooks at all; else stay at the decode budget."""
        if self.policy is None:
            return DecodeHooks()
        if self.decode_budget is None:
            return DecodeHooks()
        return DecodeHooks(observer=self.observer, after_step=self.after_step)

    def stats(self) -> dict:
        return {**self._stats, "phase": self.policy.phase if self.policy is not None else None,
                "decode_budget_tokens": self.decode_budget,
                "decode_evictions": self._decode_evictions, "max_cache_tokens": self._max_cache_tokens}
