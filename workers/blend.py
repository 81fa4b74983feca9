"""CacheBlend: fuse independently computed chunk KV, then repair it by recomputing a few tokens.

Stored chunk KV was computed with each chunk alone at positions 0..n-1, so it
lacks attention to the preceding chunks. CacheBlend (Yao et al., 2024) observes
that only a small fraction of tokens deviate much, and that the tokens which
deviate at an early layer are the ones that deviate later. So:

1. place every chunk at its offset (keys re-rotated by the offset, see rope.py);
2. run layer 0 for every non-prefix token (cheap, one layer) — layer-0 K/V are
   context-free, but its output feeds layer 1;
3. at `check_layer` project fresh K/V for every chunk token and compare them with
   the stored ones; pick the `ratio` fraction that deviates most;
4. from there on only those tokens plus the always-computed ones (separators,
   question, template) go through the layers, their fresh K/V overwriting the
   stored entries of the fused cache they attend over.

With ratio 1 every token is recomputed at every layer: exactly a full prefill.
With ratio 0 only the always-computed tokens run: the same as plain reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstore.kernels.dispatch import rerotate_keys
from kvstore.kv import ChunkKV
from workers.cache import KVCache, LayerKV
from workers.prompt import PromptLayout


@dataclass(frozen=True)
class BlendConfig:
    recompute_ratio: float = 0.15
    check_layer: int = 1  # layer whose K/V deviation picks the tokens (layer 0 K/V do not depend on context)
    deviation: str = "kv"  # "k", "v" or "kv": which fresh-vs-stored difference ranks the tokens


def fuse_chunks(runner, layout: PromptLayout, prefix: ChunkKV, chunks: list[ChunkKV]) -> tuple[KVCache, torch.Tensor]:
    """Fused cache over the whole prompt: exact prefix KV, re-rotated chunk KV, zeros for the rest.

    Returns the cache and `computed` [prompt_len] bool: tokens with no stored KV (must be computed).
    """
    device, dtype, n = runner.device, runner.dtype, layout.num_tokens
    shape = runner.shape
    keys = torch.zeros(shape.num_layers, shape.num_kv_heads, n, shape.head_dim, device=device, dtype=dtype)
    values = torch.zeros_like(keys)
    computed = torch.ones(n, dtype=torch.bool, device=device)
    keys[:, :, : layout.prefix_len] = prefix.keys.to(device, dtype)
    values[:, :, : layout.prefix_len] = prefix.values.to(device, dtype)
    computed[: layout.prefix_len] = False
    for (start, end), chunk in zip(layout.chunk_spans, chunks):
        # Triton on CUDA, workers.rope.rerotate_keys otherwise (kvstore/kernels/dispatch.py)
        keys[:, :, start:end] = rerotate_keys(chunk.keys.to(device), start, runner.inv_freq, out_dtype=dtype)
        values[:, :, start:end] = chunk.values.to(device, dtype)
        computed[start:end] = False
    positions = torch.arange(n, device=device)
    cache = KVCache([LayerKV(keys[i], values[i], positions) for i in range(shape.num_layers)])
    return cache, computed


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


def select_tokens(deviation: torch.Tensor, candidates: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices (into the prompt) of the `ratio` fraction of candidate tokens with the largest deviation."""
    count = int(round(ratio * candidates.numel()))
    if count == 0:
        return candidates[:0]
    top = torch.topk(deviation[candidates], k=count).indices
    return candidates[top]


@torch.inference_mode()
def blend_prefill(runner, layout: PromptLayout, cache: KVCache, computed: torch.Tensor, config: BlendConfig,
                  observer=None, reuse: bool = False) -> tuple[torch.Tensor, dict]:
    """Run the selective recompute over a fused cache; returns (logits of the last token [1, vocab], stats).

    `computed` marks tokens without stored KV (they always run). `reuse=True` is plain
    reuse: only those tokens run and nothing stored is overwritten (blend at ratio 0
    must agree with it, which `ragkv check` verifies).
    """
    if not 0 <= config.check_layer < runner.shape.num_layers:
        raise ValueError(f"check_layer must be in [0, {runner.shape.num_layers}), got {config.check_layer}")
    device = runner.device
    ids = torch.tensor(layout.token_ids, device=device)
    positions = torch.arange(layout.num_tokens, device=device)
    chunk_tokens = (~computed).nonzero().flatten()
    chunk_tokens = chunk_tokens[chunk_tokens >= layout.prefix_len]
    always = computed.nonzero().flatten()

    # active: prompt indices whose hidden states go through the current layer
    active = always if reuse else torch.arange(layout.prefix_len, layout.num_tokens, device=device)
    hidden = runner.embed(ids[active])
    selected = chunk_tokens[:0]
    for layer in range(runner.shape.num_layers):
        if not reuse and layer == config.check_layer:
            hidden, active, selected = _select_at_check_layer(runner, layer, hidden, active, cache, chunk_tokens,
                                                              always, config)
        hidden = runner.layer_forward(layer, hidden, positions[active], cache, slots=active, observer=observer)
    logits = runner.logits(hidden[-1:])
    stats = {"recomputed_tokens": int(selected.numel()), "always_computed_tokens": int(always.numel()),
             "check_layer": config.check_layer}
    return logits, stats


def _select_at_check_layer(runner, layer, hidden, active, cache, chunk_tokens, always, config):
    """Rank chunk tokens by fresh-vs-stored K/V deviation; keep the selected + always-computed rows."""
    block = runner.layers[layer]
    _, fresh_k, fresh_v = runner.qkv(layer, block.input_layernorm(hidden), active)
    kv = cache.layers[layer]
    # rows of `active` that are chunk tokens (active = every non-prefix token, in order)
    rows = chunk_tokens - active[0]
    deviation = torch.zeros(int(active.max()) + 1, device=active.device)
    deviation[chunk_tokens] = kv_deviation(fresh_k[:, rows], fresh_v[:, rows], kv.keys[:, chunk_tokens],
                                           kv.values[:, chunk_tokens], config.deviation)
    selected = select_tokens(deviation, chunk_tokens, config.recompute_ratio)
    keep = torch.sort(torch.cat([selected, always])).values
    return hidden[keep - active[0]], keep, selected
