"""Eviction math as plain torch functions: token scores, layer concentration, the L1 loss and its bound.

Shapes: Hq query heads, Hkv kv heads (GQA groups of Hq // Hkv), S query rows,
T cached slots, D head dim. Attention rows come from `workers.attention.attention_weights`
on captured queries, so no function here needs the model to run eager attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def group_mean(x: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """x: [Hq, ...] -> [Hkv, ...]: mean over the query heads that share a kv head (GQA)."""
    groups = x.shape[0] // num_kv_heads
    return x.reshape(num_kv_heads, groups, *x.shape[1:]).mean(dim=1)


def accumulated_attention(attn: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """H2O (Zhang et al. 2023) heavy-hitter score. attn: [Hq, S, T] -> [Hkv, T], summed over the S queries."""
    return group_mean(attn.sum(dim=1), num_kv_heads)


def newest_query_attention(attn: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """TOVA (Oren et al. 2024): attention of the newest query only. attn: [Hq, S, T] -> [Hkv, T]."""
    return group_mean(attn[:, -1], num_kv_heads)


def pooled_window_attention(attn: torch.Tensor, num_kv_heads: int, kernel: int = 7, pool: str = "max") -> torch.Tensor:
    """SnapKV (Li et al. 2024): attention of an observation window, pooled along the slots.

    attn: [Hq, W, T] -> [Hkv, T]. Pooling (1-D, stride 1, odd kernel) spreads a peak to its
    neighbours so a kept token keeps the context around it.
    """
    summed = attn.sum(dim=1)[:, None, :]  # [Hq, 1, T]
    if kernel > 1:
        pad = kernel // 2
        if pool == "max":
            summed = F.max_pool1d(summed, kernel, stride=1, padding=pad)
        elif pool == "avg":
            summed = F.avg_pool1d(summed, kernel, stride=1, padding=pad, count_include_pad=False)
        else:
            raise ValueError(f"pool must be 'max' or 'avg', got {pool!r}")
    return group_mean(summed[:, 0], num_kv_heads)


def key_leverage(keys: torch.Tensor, rank: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Statistical leverage of each key in the key matrix's top singular subspace.

    keys: [Hkv, T, D] -> [Hkv, T] = ||U^T k_i||^2 / ||k_i||^2, U: [D, rank] the top right
    singular vectors of K (per head); in [0, 1]. `valid` [Hkv, T] drops padding slots from the SVD.
    """
    k = keys.float()
    if valid is not None:
        k = k * valid[..., None]
    rank = max(1, min(rank, k.shape[-1], k.shape[-2]))
    _, _, vh = torch.linalg.svd(k, full_matrices=False)  # vh: [Hkv, min(T, D), D]
    u = vh[:, :rank].transpose(-1, -2)  # [Hkv, D, rank]
    projected = (k @ u).pow(2).sum(dim=-1)  # [Hkv, T]
    return projected / k.pow(2).sum(dim=-1).clamp_min(1e-12)


def attention_entropy(attn: torch.Tensor) -> torch.Tensor:
    """attn: [Hq, S, T] -> [Hq, S] Shannon entropy (nats) of each row."""
    p = attn.float().clamp_min(1e-30)
    return -(attn.float() * p.log()).sum(dim=-1)


def effective_support(attn: torch.Tensor) -> float:
    """How spread a layer's attention is: mean over heads and rows of exp(entropy) (tokens).

    A layer that attends to a handful of tokens (concentrated) needs few slots;
    DynamicKV gives the budget to spread layers.
    """
    return float(attention_entropy(attn).exp().mean())


def eviction_l1(attn: torch.Tensor, values: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """L1 error of evicting, and its upper bound, per query head and row.

    attn: [Hq, S, T] full-cache attention rows; values: [Hkv, T, D]; keep: [Hkv, T] bool.
    o = sum_i a_i v_i; ô = sum_{j kept} a_j v_j / Z with Z = sum_{j kept} a_j. Since
    o - ô = sum_{i evicted} a_i v_i + (1 - 1/Z) sum_{j kept} a_j v_j and
    ||sum_{j kept} a_j v_j||_1 <= Z max_{k kept} ||v_k||_1:
        ||o - ô||_1 <= sum_{i evicted} a_i ||v_i||_1 + |1 - Z| max_{k kept} ||v_k||_1
    (|Z - 1| = |1 - sum_{j kept} a_j|). Returns (loss, bound), each [Hq, S].
    """
    groups = attn.shape[0] // values.shape[0]
    v = values.float().repeat_interleave(groups, dim=0)  # [Hq, T, D]
    kept = keep.repeat_interleave(groups, dim=0)[:, None, :]  # [Hq, 1, T]
    a = attn.float()
    out = a @ v  # [Hq, S, D]
    a_kept = a * kept
    z = a_kept.sum(dim=-1, keepdim=True)  # [Hq, S, 1]
    out_kept = (a_kept / z.clamp_min(1e-30)) @ v
    loss = (out - out_kept).abs().sum(dim=-1)  # [Hq, S]
    v_norm = v.abs().sum(dim=-1)  # [Hq, T]
    evicted_term = (a * ~kept * v_norm[:, None, :]).sum(dim=-1)  # [Hq, S]
    v_max = v_norm.masked_fill(~kept[:, 0], 0.0).amax(dim=-1)  # [Hq]
    bound = evicted_term + (1.0 - z[..., 0]).abs() * v_max[:, None]
    return loss, bound
