"""Who keeps how many: protection, top-k selection, per-head (Ada-KV) and per-layer (PyramidKV, DynamicKV) budgets.

Plain torch/python functions. A budget always counts the protected tokens:
protected entries are set aside before scoring and the policy picks the rest.
"""

from __future__ import annotations

import math

import torch


def protected_mask(positions: torch.Tensor, sink_tokens: int, prefix_len: int,
                   spans: tuple[tuple[int, int], ...] = ()) -> torch.Tensor:
    """positions: [T] or [Hkv, T] logical positions -> bool, same shape: sinks, prefix and spans."""
    mask = positions < max(sink_tokens, prefix_len)
    for start, end in spans:
        mask |= (positions >= start) & (positions < end)
    return mask


def count_protected(prompt_len: int, sink_tokens: int, prefix_len: int, spans: tuple[tuple[int, int], ...] = ()) -> int:
    """Number of the prompt's positions 0..prompt_len-1 that are protected."""
    return int(protected_mask(torch.arange(prompt_len), sink_tokens, prefix_len, spans).sum())


def select_kept_tokens(scores: torch.Tensor, protected: torch.Tensor, budget: int) -> torch.Tensor:
    """One token set for all heads. scores, protected: [T] -> keep [T] bool with max(budget, #protected) True.

    Higher score = keep; protected tokens are kept and not ranked.
    """
    keep = protected.clone()
    free = min(budget - int(protected.sum()), int((~protected).sum()))
    if free > 0:
        ranked = scores.float().masked_fill(protected, float("-inf"))
        keep[torch.topk(ranked, free).indices] = True
    return keep


def select_per_head(scores: torch.Tensor, protected: torch.Tensor, valid: torch.Tensor, budget: int,
                    floor: float = 0.2, cap: float | None = None) -> torch.Tensor:
    """Ada-KV (Feng et al. 2024) allocation: heads of a layer compete for budget * Hkv entries.

    scores, protected, valid: [Hkv, T] -> keep [Hkv, T] bool. Each head first keeps its protected
    entries and its own top `floor` share of the free per-head budget (a safeguard so no head
    is starved); the rest goes to the top scores over the flattened layer, so heads whose
    attention is concentrated give slots to heads whose attention is spread. floor=1 is plain
    per-head top-k (every head keeps `budget`, each its own tokens: SnapKV's selection).

    `cap`: no head keeps more than ceil(cap * budget) entries (None = unbounded). A per-head
    layout costs the longest head's length in memory, so the cap bounds the padding.
    """
    heads, slots = scores.shape
    protected = protected & valid
    keep = protected.clone()
    ranked = scores.float().masked_fill(~valid | protected, float("-inf"))
    candidates = valid & ~protected
    per_head_free = budget - protected.sum(dim=1)  # [Hkv]
    for h in range(heads):
        n = min(int(per_head_free[h] * floor), int(candidates[h].sum()))
        if n > 0:
            keep[h, torch.topk(ranked[h], n).indices] = True
    eligible = candidates & ~keep
    if cap is not None:  # each head's best remaining entries up to its cap (greedy with a cap = top-k over these)
        room = (math.ceil(cap * budget) - keep.sum(dim=1)).clamp_min(0)  # [Hkv]
        rank = torch.argsort(torch.argsort(ranked.masked_fill(keep, float("-inf")), dim=1, descending=True), dim=1)
        eligible &= rank < room[:, None]
    free = min(budget * heads - int(keep.sum()), int(eligible.sum()))
    if free > 0:
        flat = ranked.masked_fill(~eligible, float("-inf")).reshape(-1)
        keep.view(-1)[torch.topk(flat, free).indices] = True
    return keep


def global_layer_counts(scores: list[torch.Tensor], protected: list[torch.Tensor], valid: list[torch.Tensor],
                        budget: int) -> list[float]:
    """KVzip's non-uniform layer budgets (Kim et al. 2025): one top-k over every layer and head.

    scores, protected, valid: per layer [Hkv, T_l]. Protected entries are set aside first; the rest of the
    `budget * layers * Hkv` entries go to the highest scores over the whole cache. -> entries per head of
    each layer (float, protected included), summing to budget * layers. Scores must be comparable across
    layers (attention probabilities).
    """
    heads = scores[0].shape[0]
    kept = [int((p & v).sum()) for p, v in zip(protected, valid)]
    flat = torch.cat([s.float().masked_fill(~v | p, float("-inf")).reshape(-1)
                      for s, p, v in zip(scores, protected, valid)])
    k = max(0, min(budget * len(scores) * heads - sum(kept), int((flat > float("-inf")).sum())))
    picked = torch.zeros_like(flat, dtype=torch.bool)
    picked[torch.topk(flat, k).indices] = True
    sizes = [s.numel() for s in scores]
    return [(base + float(part.sum())) / heads for base, part in zip(kept, torch.split(picked, sizes))]


def round_counts(counts: list[float], total: int) -> list[int]:
    """Largest-remainder rounding: floats summing to ~total -> ints summing to total (ties by index)."""
    floors = [math.floor(c) for c in counts]
    order = sorted(range(len(counts)), key=lambda i: (-(counts[i] - floors[i]), i))
    for i in order[:max(0, total - sum(floors))]:
        floors[i] += 1
    return floors


def pyramid_weights(num_layers: int, beta: float = 20.0) -> list[float]:
    """PyramidKV (Cai et al. 2024): budgets fall linearly from layer 0 to the last layer.

    For a mean budget b the last layer gets b / beta and the first 2b - b / beta; -> weights with mean 1.
    """
    low = 1.0 / beta
    high = 2.0 - low
    if num_layers == 1:
        return [1.0]
    return [high - (high - low) * i / (num_layers - 1) for i in range(num_layers)]


def allocate(weights: list[float], mean_budget: int, lower: list[int], upper: list[int]) -> list[int]:
    """Integer per-layer budgets proportional to `weights`, clamped to [lower, upper], summing to
    mean_budget * len(weights) (or to what the bounds allow). Water-filling by bisection on the scale."""
    total = mean_budget * len(weights)
    total = max(sum(lower), min(total, sum(upper)))

    def clamped(scale: float) -> list[float]:
        return [min(max(w * scale, lo), hi) for w, lo, hi in zip(weights, lower, upper)]

    lo_s, hi_s = 0.0, 1.0
    while sum(clamped(hi_s)) < total and hi_s < 1e12:
        hi_s *= 2
    for _ in range(100):
        mid = (lo_s + hi_s) / 2
        lo_s, hi_s = (mid, hi_s) if sum(clamped(mid)) < total else (lo_s, mid)
    exact = clamped(hi_s)
    budgets = [min(max(math.floor(x), lo), hi) for x, lo, hi in zip(exact, lower, upper)]
    order = sorted(range(len(exact)), key=lambda i: exact[i] - math.floor(exact[i]), reverse=True)
    while sum(budgets) < total:
        grew = False
        for i in order:
            if sum(budgets) >= total:
                break
            if budgets[i] < upper[i]:
                budgets[i] += 1
                grew = True
        if not grew:
            break
    while sum(budgets) > total:
        shrunk = False
        for i in reversed(order):
            if sum(budgets) <= total:
                break
            if budgets[i] > lower[i]:
                budgets[i] -= 1
                shrunk = True
        if not shrunk:
            break
    return budgets
