"""CacheBlend: fuse independently computed chunk KV, then repair it by recomputing a few tokens.

Stored chunk KV was computed with each chunk alone at positions 0..n-1, so it
lacks attention to the preceding chunks. CacheBlend (Yao et al., 2024) observes
that only a small fraction of tokens deviate much, and that the tokens which
deviate at an early layer are the ones that deviate later. So:

1. place every chunk at its offset (keys re-rotated by the offset, see rope.py): `fuse_chunks`;
2. run the layers before `check_layer` for every non-prefix token (layer-0 K/V are
   context-free, but its output feeds layer 1, where cross-chunk attention first shows);
3. pick the tokens to recompute with a selection method (workers/selection.py:
   CacheBlend's one-shot K/V deviation at `check_layer`, or its gradual filtering);
4. from there on only those tokens plus the always-computed ones (separators,
   question, template) go through the layers, their fresh K/V overwriting the
   stored entries of the fused cache they attend over: `recompute`.

With ratio 1 every token is recomputed at every layer: exactly a full prefill.
With ratio 0 only the always-computed tokens run: the same as plain reuse.
The one caller is the prefill pipeline (workers/pipeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from kvstore.kv import ChunkKV
from workers.attention import PlanMemo
from workers.cache import KVCache, LayerKV
from workers.context_drift import ContextDrift, chunk_slots, drifted
from workers.placement import place
from workers.prompt import PromptLayout
from workers.selection import CHECK_LAYER, SELECTIONS, Selection, SelectionContext, make_selection

DEFAULT_METHOD = "gradual"  # `gradual` answers better over whole chunks (research/blend.md, "Selection methods")
# over a prompt holding a chunk compressed at ingest, the default method gives way to this one at this check
# layer (layer 2 there: 0.09 vs 0.385 on dev; research/blend.md "Chunks compressed at ingest")
COMPRESSED_METHOD = "deviation"
COMPRESSED_CHECK_LAYER = 1
# the cheapest ratio whose accuracy on the quality suite's `dev` is within 2 points of full's (rule set before
# the run; 60 prompts, 15 families: full 0.767, 0.15 / 0.3 / 0.5 / 0.7 = 0.667 / 0.667 / 0.717 / 0.750;
# docs/benchmarks.md "An honest default"). Cheaper ratios are one request field away: recompute_ratio
DEFAULT_RATIO = 0.7
# the server's setting (EngineConfig.blend) at this recompute ratio or above is served by an exact prefill
# instead (the stored prefix and exact head, every other token prefilled). The rule: approximate only where
# blending saves at least a quarter of full's TTFT. Measured on the 1,120-token bench in one run: 1.28x at 0.7
# (whose answers equalled full's on 0.52 of `test`), 1.27x at 0.6, 1.55x at 0.5 (docs/benchmarks.md "Exact where
# blending does not pay"). The exact prefill also stores the prompt's chunk sequence, so the next prompt over the
# same documents reads it exactly. A request that names its own ratio runs at that ratio.
EXACT_FROM = 0.6


@dataclass(frozen=True)
class BlendConfig:
    """How blend recomputes: the share of stored chunk tokens, the selection method, its check layer."""

    recompute_ratio: float = DEFAULT_RATIO
    method: str = DEFAULT_METHOD
    check_layer: int = CHECK_LAYER  # layer whose K/V deviation picks the tokens (selection.CHECK_LAYER)
    # shift every stored chunk entry by the model's measured mean context drift before choosing
    # (workers/context_drift.py); over chunks compressed at ingest too (their kept entries)
    context_drift: bool = True
    # over a prompt holding a chunk compressed at ingest: nothing recomputed by default, the stored entries only
    # shifted by the context drift (dev 0.542 vs 0.479 with deviation@0.15). None: recompute_ratio, with
    # COMPRESSED_METHOD at COMPRESSED_CHECK_LAYER
    compressed_ratio: float | None = 0.0
    # a server's setting only: from this recompute ratio on, its blend requests are served by an exact prefill
    # (EXACT_FROM in server_setting()); None: blended at any ratio
    exact_from: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.recompute_ratio <= 1.0:
            raise ValueError(f"recompute_ratio must be in [0, 1], got {self.recompute_ratio!r}")
        if self.exact_from is not None and not 0.0 < self.exact_from <= 1.0:
            raise ValueError(f"exact_from must be in (0, 1], got {self.exact_from!r}")
        if self.compressed_ratio is not None and not 0.0 <= self.compressed_ratio <= 1.0:
            raise ValueError(f"compressed_ratio must be in [0, 1] or None, got {self.compressed_ratio!r}")
        if self.method not in SELECTIONS:
            raise ValueError(f"unknown blend method {self.method!r}; expected one of {', '.join(SELECTIONS)}")

    def for_prompt(self, compressed: bool) -> "BlendConfig":
        """The setting that runs over a prompt (`compressed`: it holds a chunk compressed at ingest): there the
        default method gives way to COMPRESSED_METHOD at COMPRESSED_CHECK_LAYER, at `compressed_ratio`."""
        if not compressed:
            return self
        ratio = self.recompute_ratio if self.compressed_ratio is None else self.compressed_ratio
        method, layer = self.method, self.check_layer
        if method == DEFAULT_METHOD:
            method, layer = COMPRESSED_METHOD, COMPRESSED_CHECK_LAYER
        return replace(self, recompute_ratio=ratio, method=method, check_layer=layer, compressed_ratio=None)

    def named(self, method: str) -> "BlendConfig":
        """`method` at this ratio over every kind of chunk (a setting asked for by name: `blend:METHOD@RATIO`),
        blended at any ratio."""
        return replace(self, method=method, compressed_ratio=None, exact_from=None)

    def with_ratio(self, ratio: float) -> "BlendConfig":
        """`ratio` over every kind of chunk (a request's own ratio), each kind keeping its method, blended at
        any ratio: what was asked for runs."""
        return replace(self, recompute_ratio=ratio, compressed_ratio=None, exact_from=None)

    @property
    def exact(self) -> bool:
        """Whether this setting is served by an exact prefill (its ratio is at or above `exact_from`)."""
        return self.exact_from is not None and self.recompute_ratio >= self.exact_from

    @property
    def name(self) -> str:
        """`METHOD@RATIO`, as the quality suite spells a blend config."""
        return f"{self.method}@{self.recompute_ratio:g}"


def server_setting() -> BlendConfig:
    """The setting of a server's requests that give no ratio (EngineConfig.blend): exact from EXACT_FROM on."""
    return BlendConfig(exact_from=EXACT_FROM)


@dataclass(frozen=True)
class Recomputed:
    """What `recompute` ran: the last prompt token's hidden state and the work's size."""

    hidden: torch.Tensor  # [1, hidden] the last prompt token after the last layer
    recomputed_tokens: int  # stored chunk tokens whose K/V were recomputed (at the last layer)
    always_computed_tokens: int  # tokens with no stored KV (template, separators, question)
    token_layers: int  # tokens x layers run, the selection's probe passes included


def fuse_chunks(runner, layout: PromptLayout, prefix: ChunkKV, chunks: list[ChunkKV],
                head: Sequence[ChunkKV] = (), drift: ContextDrift | None = None,
                first: bool = True) -> tuple[KVCache, torch.Tensor]:
    """Fused cache over the whole prompt: exact prefix KV (the system-prompt prefix, then the `head` pieces,
    keys already at their real positions, up to layout.prefix_len), re-rotated chunk KV, zeros for the rest.
    With `drift`, each chunk is shifted by its slot's context drift as it is placed (`first`: the first chunk
    is the prompt's first, not one after an exact head; context_drift.chunk_slots), in the same pass
    (workers/placement.py).

    Returns the cache and `computed` [prompt_len] bool: tokens with no stored KV (must be computed).
    Every stored tensor is copied into the cache's own buffers: the inputs are never written.
    """
    device, dtype, n = runner.device, runner.dtype, layout.num_tokens
    shape = runner.shape
    # every slot is written below (prefix, chunks) or zeroed at the end (the tokens blend computes)
    keys = torch.empty(shape.num_layers, shape.num_kv_heads, n, shape.head_dim, device=device, dtype=dtype)
    values = torch.empty_like(keys)
    computed = torch.ones(n, dtype=torch.bool, device=device)
    start = 0
    for piece in (prefix, *head):  # exact: placed at 0.. as they are, nothing rotated
        end = start + piece.num_tokens
        keys[:, :, start:end] = piece.keys_at(0, runner.inv_freq, dtype, device)
        values[:, :, start:end] = piece.values
        start = end
    if start != layout.prefix_len:
        raise ValueError(f"the exact prefix holds {start} tokens, the layout's {layout.prefix_len}")
    computed[: layout.prefix_len] = False
    head_mask = None  # [L, Hkv, n] once a chunk compressed at ingest is placed: its dropped entries are masked
    for (start, end), chunk, slot in zip(layout.chunk_spans, chunks, chunk_slots(len(chunks), first)):
        computed[start:end] = False
        if chunk.positions is not None:  # compressed at ingest: kept entries only (workers/eviction/chunks.py)
            if head_mask is None:
                head_mask = torch.ones(keys.shape[:3], dtype=torch.bool, device=device)
            chunk = chunk if drift is None else drifted(chunk, slot, drift, runner.inv_freq)
            place_chunk(keys, values, head_mask, start, chunk, runner.inv_freq)
            continue
        # drift, one rotation (re-rotation by `start`, or pre-RoPE keys rotated at start..) and the copy
        place(keys, values, start, chunk, runner.inv_freq, drift, slot)
    gaps = computed.nonzero().flatten()  # separators, question, template: no stored KV until blend writes theirs
    keys.index_fill_(2, gaps, 0)
    values.index_fill_(2, gaps, 0)
    positions = torch.arange(n, device=device)
    cache = KVCache([LayerKV(keys[i], values[i], positions, None if head_mask is None else head_mask[i])
                     for i in range(shape.num_layers)])
    return cache, computed


def place_chunk(keys: torch.Tensor, values: torch.Tensor, head_mask: torch.Tensor, start: int, chunk: ChunkKV,
                inv_freq: torch.Tensor) -> None:
    """Write a compressed chunk into fused prompt tensors (in place).

    keys, values: [L, Hkv, P, D]; head_mask: [L, Hkv, P] bool. The chunk's span [start, start + n) is
    masked out except the kept entries, which go to start + their position, keys re-rotated by `start`."""
    device, dtype = keys.device, keys.dtype
    end = start + len(chunk.token_ids)
    rotated = chunk.keys_at(start, inv_freq, dtype, device)  # [L, Hkv, S, D], post-RoPE: one re-rotation
    mask = chunk.head_mask.to(device)
    layer, head, slot = mask.nonzero(as_tuple=True)
    target = start + chunk.positions.to(device)[layer, head, slot]
    keys[:, :, start:end] = 0
    values[:, :, start:end] = 0
    head_mask[:, :, start:end] = False
    keys[layer, head, target] = rotated[layer, head, slot]
    values[layer, head, target] = chunk.values.to(device, dtype)[layer, head, slot]
    head_mask[layer, head, target] = True



def chunk_tokens(layout: PromptLayout, computed: torch.Tensor) -> torch.Tensor:
    """[C] sorted prompt indices of stored chunk tokens (the prefix is stored too, but never recomputed)."""
    stored = (~computed).nonzero().flatten()
    return stored[stored >= layout.prefix_len]


def recompute_budget(config: BlendConfig | None, candidates: int) -> int:
    """Stored chunk tokens to recompute: round(ratio x candidates); none for plain reuse (config None)."""
    return 0 if config is None else int(round(config.recompute_ratio * candidates))


@torch.inference_mode()
def recompute(runner, layout: PromptLayout, cache: KVCache, computed: torch.Tensor, config: BlendConfig | None,
              observer=None) -> Recomputed:
    """Selective recompute over a fused cache, in place. `config` None is plain reuse: only the tokens
    without stored KV (`computed`) run and nothing stored is overwritten (blend at ratio 0 agrees with it
    over whole chunks, which `ragkv check` verifies)."""
    if config is not None and not 0 <= config.check_layer < runner.shape.num_layers:
        raise ValueError(f"check_layer must be in [0, {runner.shape.num_layers}), got {config.check_layer}")
    method = Selection() if config is None else make_selection(config)
    device = runner.device
    ids = torch.tensor(layout.token_ids, device=device)
    positions = torch.arange(layout.num_tokens, device=device)
    candidates = chunk_tokens(layout, computed)
    ctx = SelectionContext(runner, layout, cache, candidates, computed.nonzero().flatten(),
                           recompute_budget(config, candidates.numel()))
    active = method.start(ctx)  # [A] sorted prompt indices whose hidden states go through the current layer
    hidden = runner.embed(ids[active])  # [A, hidden]
    token_layers = method.extra_token_layers(ctx)
    plans, at = PlanMemo(), positions[active]  # layers between two choices share their attention plan
    for layer in range(runner.shape.num_layers):
        keep = method.keep(layer, ctx, hidden, active)
        if keep is not None:
            hidden, active = hidden.index_select(0, torch.searchsorted(active, keep)), keep
            at = positions[active]
        hidden = runner.layer_forward(layer, hidden, at, cache, slots=active, observer=observer, plans=plans)
        token_layers += active.numel()
    return Recomputed(hidden[-1:], int(torch.isin(active, candidates).sum()), int(ctx.always.numel()), token_layers)
