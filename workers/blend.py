"""CacheBlend: fuse independently computed chunk KV, then repair it by recomputing a few tokens.

Stored chunk KV was computed with each chunk alone at positions 0..n-1, so it
lacks attention to the preceding chunks. CacheBlend (Yao et al., 2024) observes
that only a small fraction of tokens deviate much, and that the tokens which
deviate at an early layer are the ones that deviate later. So:

1. place every chunk at its offset (keys re-rotated by the offset, see rope.py);
2. run the layers before `check_layer` (0 and 1 by default; a deviation method's
   `start`) for every non-prefix token — layer-0 K/V are context-free, but its
   output feeds layer 1, where cross-chunk attention first shows;
3. pick the tokens to recompute with a selection method (workers/selection.py:
   CacheBlend's K/V deviation at `check_layer`, its gradual filtering, EPIC's
   LegoLink, question attention, hybrids);
4. from there on only those tokens plus the always-computed ones (separators,
   question, template) go through the layers, their fresh K/V overwriting the
   stored entries of the fused cache they attend over.

With ratio 1 every token is recomputed at every layer: exactly a full prefill.
With ratio 0 only the always-computed tokens run: the same as plain reuse.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kvstore.kv import ChunkKV
from workers.cache import KVCache, LayerKV
from workers.context_drift import ContextDrift, chunk_range, shift_chunks
from workers.drift import chunk_index, key_drift, shift_keys, shift_values, value_drift
from workers.eviction.chunks import place_chunk
from workers.prompt import PromptLayout
from workers.selection import (CHECK_LAYER, SELECTIONS, Selection, SelectionContext, kv_deviation,  # noqa: F401
                                make_selection, select_tokens)


@dataclass(frozen=True)
class BlendConfig:
    recompute_ratio: float = 0.15
    check_layer: int = CHECK_LAYER  # layer whose K/V deviation picks the tokens (selection.CHECK_LAYER)
    deviation: str = "kv"  # "k", "v" or "kv": which fresh-vs-stored difference ranks the tokens
    # names in workers.selection.SELECTIONS. `gradual` answers better over whole chunks and `deviation`
    # over chunks compressed at ingest (docs/blend.md, "Selection methods"), so the default is one per chunk kind:
    method: str = "gradual"
    # over a prompt holding a chunk compressed at ingest: nothing recomputed by default, the stored entries only
    # shifted by the context drift (dev 0.542 vs 0.479 with deviation@0.15: a token recomputed there attends
    # over compressed chunks, and its fresh K/V are worse than the stored ones; README "Chunks compressed at
    # ingest"). None: recompute_ratio, with the method and check layer below
    compressed_ratio: float | None = 0.0
    compressed_method: str | None = "deviation"  # there, when a ratio is asked for (with_ratio); None: method
    compressed_check_layer: int | None = 1  # its check layer there (layer 2: 0.09 vs 0.385 on dev); None: check_layer
    sink_tokens: int | None = None  # legolink: first k of every chunk (None = the ratio share); hybrids: 4
    gradual_widen: float = 3.0  # gradual: the first check layer keeps this many times the budget
    gradual_steps: int = 3  # gradual: layers over which the set narrows to the budget
    probe_layers: int | None = None  # attention: layers of the question probe (None = all)
    attended_share: float = 0.33  # attended-*: the share of the budget the question probe picks
    key_scale: float = 1.0  # attention temperature on reused chunk keys (APE-style); 1 = off
    drift: bool = False  # shift the stored K/V that are not recomputed by the recomputed ones' drift (drift.py)
    # shift every stored chunk entry by the model's measured mean context drift before choosing
    # (workers/context_drift.py); over chunks compressed at ingest too (their kept entries)
    context_drift: bool = True

    def __post_init__(self) -> None:
        if self.compressed_ratio is not None and not 0.0 <= self.compressed_ratio <= 1.0:
            raise ValueError(f"compressed_ratio must be in [0, 1] or None, got {self.compressed_ratio!r}")
        for name in (self.method, self.compressed_method):
            if name is not None and name not in SELECTIONS:
                raise ValueError(f"unknown blend method {name!r}; expected one of {', '.join(SELECTIONS)}")

    def for_prompt(self, compressed: bool) -> "BlendConfig":
        """The setting that runs over a prompt (`compressed`: it holds a chunk compressed at ingest)."""
        if not compressed:
            return self
        layer = self.check_layer if self.compressed_check_layer is None else self.compressed_check_layer
        ratio = self.recompute_ratio if self.compressed_ratio is None else self.compressed_ratio
        return replace(self, method=self.compressed_method or self.method, check_layer=layer,
                       recompute_ratio=ratio, compressed_method=None, compressed_check_layer=None,
                       compressed_ratio=None)

    def named(self, method: str) -> "BlendConfig":
        """`method` over every kind of chunk (a setting asked for by name: `blend:METHOD@RATIO`)."""
        return replace(self, method=method, compressed_method=None, compressed_check_layer=None,
                       compressed_ratio=None)

    def with_ratio(self, ratio: float) -> "BlendConfig":
        """`ratio` over every kind of chunk (a request's own ratio), each kind keeping its method."""
        return replace(self, recompute_ratio=ratio, compressed_ratio=None)

    @property
    def name(self) -> str:
        """`METHOD@RATIO[:drift]`, as the quality suite spells a blend config."""
        return f"{self.method}@{self.recompute_ratio:g}" + (":drift" if self.drift else "")


def fuse_chunks(runner, layout: PromptLayout, prefix: ChunkKV, chunks: list[ChunkKV]) -> tuple[KVCache, torch.Tensor]:
    """Fused cache over the whole prompt: exact prefix KV, re-rotated chunk KV, zeros for the rest.

    Returns the cache and `computed` [prompt_len] bool: tokens with no stored KV (must be computed).
    """
    device, dtype, n = runner.device, runner.dtype, layout.num_tokens
    shape = runner.shape
    # every slot is written below (prefix, chunks) or zeroed at the end (the tokens blend computes)
    keys = torch.empty(shape.num_layers, shape.num_kv_heads, n, shape.head_dim, device=device, dtype=dtype)
    values = torch.empty_like(keys)
    computed = torch.ones(n, dtype=torch.bool, device=device)
    keys[:, :, : layout.prefix_len] = prefix.keys_at(0, runner.inv_freq, dtype, device)
    values[:, :, : layout.prefix_len] = prefix.values.to(device, dtype)
    computed[: layout.prefix_len] = False
    head_mask = None  # [L, Hkv, n] once a chunk compressed at ingest is placed: its dropped entries are masked
    for (start, end), chunk in zip(layout.chunk_spans, chunks):
        computed[start:end] = False
        if chunk.positions is not None:  # compressed at ingest: kept entries only (workers/eviction/chunks.py)
            if head_mask is None:
                head_mask = torch.ones(keys.shape[:3], dtype=torch.bool, device=device)
            place_chunk(keys, values, head_mask, start, chunk, runner.inv_freq)
            continue
        # one rotation: re-rotation by `start`, or pre-RoPE keys rotated at start.. (ChunkKV.keys_at);
        # Triton on CUDA, kvstore.rope otherwise (kvstore/kernels/dispatch.py)
        keys[:, :, start:end] = chunk.keys_at(start, runner.inv_freq, dtype, device)
        values[:, :, start:end] = chunk.values.to(device, dtype)
    gaps = computed.nonzero().flatten()  # separators, question, template: no stored KV until blend writes theirs
    keys.index_fill_(2, gaps, 0)
    values.index_fill_(2, gaps, 0)
    positions = torch.arange(n, device=device)
    cache = KVCache([LayerKV(keys[i], values[i], positions, None if head_mask is None else head_mask[i])
                     for i in range(shape.num_layers)])
    return cache, computed


class DriftRepair:
    """One layer's drift repair (workers/drift.py): remembers the stored K/V of the chunk tokens about to
    be recomputed; once their fresh K/V are written, shifts the other stored K/V of each chunk by the
    mean drift of that chunk's recomputed tokens (of all recomputed tokens where a chunk has none)."""

    def __init__(self, runner, layout: PromptLayout, kv: LayerKV, chunk_tokens: torch.Tensor, active: torch.Tensor):
        self.inv_freq, self.num_chunks = runner.inv_freq, len(layout.chunk_spans)
        self.recomputed = chunk_tokens[torch.isin(chunk_tokens, active)]  # [R] prompt indices
        self.stored = chunk_tokens[~torch.isin(chunk_tokens, active)]  # [S] keep their stored K/V here
        self.chunk_of_recomputed = chunk_index(self.recomputed, layout.chunk_spans)  # [R] chunk index
        self.chunk_of_stored = chunk_index(self.stored, layout.chunk_spans)  # [S]
        self.keys = kv.keys[:, self.recomputed].clone()  # [Hkv, R, D] stored, before the recompute
        self.values = kv.values[:, self.recomputed].clone()

    def __call__(self, layer: int, kv: LayerKV) -> None:
        if self.recomputed.numel() == 0 or self.stored.numel() == 0:
            return
        fresh, held = self.recomputed, None if kv.head_mask is None else kv.head_mask[:, self.recomputed]
        chunks = (self.chunk_of_recomputed, self.num_chunks, held)
        keys = key_drift(kv.keys[:, fresh], self.keys, kv.positions[fresh], self.inv_freq, *chunks)  # [Hkv, C, D]
        values = value_drift(kv.values[:, fresh], self.values, *chunks)
        rest, mine = self.stored, self.chunk_of_stored
        kv.keys[:, rest] = shift_keys(kv.keys[:, rest], keys[:, mine], kv.positions[rest], self.inv_freq)
        kv.values[:, rest] = shift_values(kv.values[:, rest], values[:, mine])


@torch.inference_mode()
def blend_prefill(runner, layout: PromptLayout, cache: KVCache, computed: torch.Tensor, config: BlendConfig,
                  observer=None, reuse: bool = False, drift: ContextDrift | None = None,
                  shift: bool | None = None) -> tuple[torch.Tensor, dict]:
    """Run the selective recompute over a fused cache; returns (logits of the last token [1, vocab], stats).

    `computed` marks tokens without stored KV (they always run). `reuse=True` is plain
    reuse: only those tokens run and nothing stored is overwritten (blend at ratio 0
    must agree with it over whole chunks, which `ragkv check` verifies). `drift`: the model's context drift
    (workers/context_drift.py), added to every stored chunk entry first when the config asks for it
    and something is recomputed; over chunks compressed at ingest whenever blend runs, since nothing is
    recomputed there by default (`BlendConfig.compressed_ratio`). `shift` overrides that rule: True shifts
    whenever a drift is given (the `shift` mode: reuse=True, the drift alone), False never does.
    """
    if not 0 <= config.check_layer < runner.shape.num_layers:
        raise ValueError(f"check_layer must be in [0, {runner.shape.num_layers}), got {config.check_layer}")
    compressed = cache.layers[0].head_mask is not None  # fuse_chunks masks the entries those chunks dropped
    config = config.for_prompt(compressed)
    method = Selection() if reuse else make_selection(config)
    device = runner.device
    ids = torch.tensor(layout.token_ids, device=device)
    positions = torch.arange(layout.num_tokens, device=device)
    chunk_tokens = (~computed).nonzero().flatten()
    chunk_tokens = chunk_tokens[chunk_tokens >= layout.prefix_len]
    if config.key_scale != 1.0 and not reuse:
        for kv in cache.layers:
            kv.keys[:, chunk_tokens] *= config.key_scale
    budget = 0 if reuse else int(round(config.recompute_ratio * chunk_tokens.numel()))
    # whole chunks: only when something is recomputed (ratio 0 stays plain reuse); compressed ones: whenever blend runs
    if shift is None:
        shift = config.context_drift and not reuse and (budget > 0 or compressed)
    shifted = bool(shift and drift is not None)
    if shifted:
        shift_chunks(cache, chunk_range(layout), drift, runner.inv_freq)
    ctx = SelectionContext(runner, layout, cache, chunk_tokens, computed.nonzero().flatten(), budget)

    active = method.start(ctx)  # sorted prompt indices whose hidden states go through the current layer
    hidden = runner.embed(ids[active])
    token_layers = method.extra_token_layers(ctx)
    for layer in range(runner.shape.num_layers):
        keep = method.keep(layer, ctx, hidden, active)
        if keep is not None:
            hidden, active = hidden[torch.searchsorted(active, keep)], keep
        repair = None
        if config.drift and not reuse:
            repair = DriftRepair(runner, layout, cache.layers[layer], chunk_tokens, active)
        hidden = runner.layer_forward(layer, hidden, positions[active], cache, slots=active, observer=observer,
                                      repair=repair)
        token_layers += active.numel()
    logits = runner.logits(hidden[-1:])
    stats = {"recomputed_tokens": int(torch.isin(active, chunk_tokens).sum()),
             "always_computed_tokens": int(ctx.always.numel()),
             "check_layer": config.check_layer, "blend_method": ("shift" if shifted else "reuse") if reuse else config.method,
             "blend_config": config.name,
             "key_drift": bool(config.drift and not reuse),
             "context_drift": shifted,
             "recompute_ratio": 0.0 if reuse else config.recompute_ratio,
             # token-layers run, against a full prefill's (a deterministic compute cost)
             "compute_fraction": token_layers / (layout.num_tokens * runner.shape.num_layers)}
    return logits, stats
