"""One decoder layer of a decode step, as one plain torch function that TorchScript compiles.

A decode step is a few rows through 30 small layers: ~25 small ops per layer, each a few
microseconds of dispatch on a CPU, against ~0.2 ms of weight reading per layer. The same function,
scripted, runs those ops without the Python interpreter. Measured on the 2-core box (default model,
150 cached tokens, one process, alternating): 13.7-15.9 ms a step scripted against 14.8-20 ms eager,
about 10% (the per-op dispatch itself stays). torch.compile of a static-shape variant gave ~14%
after a 60 s compile per process. `decode_layer_eager` is the same source run eagerly (a test holds
them bit-equal).

    hidden [B, hidden] in the model's dtype (updated in place: += attention, += MLP)
    rotation [B, D, D]: row b's RoPE at its position, with this layer's frequencies (step.rope_matrix)
    row b's layer cache: keys[b] / values[b] [Hkv, T, D] (or packed [1, N, D] with masks[b] the
    owners), whose newest slots key_slots[b] / value_slots[b] [Hkv, 1, D] this writes; masks[b]
    [Hkv, T] (or None: all) the entries row b's token sees (per-head eviction, sliding window).
Returns the rotated queries [B, Hq, D] (observers read them after the layer).

Two layer forms, one function (`ffn_norms` tells them apart):

    Llama     h += o(attn(norm_0(h)));        h += mlp(norm_1(h))                        act = SiLU
    Gemma 3   h += norm_1(o(attn(norm_0(h)))); h += ffn_norms_1(mlp(ffn_norms_0(h)))     act = GELU (tanh)
"""

from __future__ import annotations

import warnings
from typing import List, Optional

import torch
import torch.nn.functional as F

from workers.batching.linear import apply_linear

SILU, GELU_TANH = 0, 1  # decode_layer's `activation` codes (TorchScript reads no globals: it spells them 0, 1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] normalized in fp32, scaled by `weight` [n], in x's dtype. The mean square comes from
    one vector norm: fewer ops than torch.rms_norm's composite (12 against 19 us a call here).

    The scale is applied in the weight's dtype: LlamaRMSNorm's weight (the model's dtype) after the
    cast back to x's dtype; Gemma3RMSNorm's (1 + weight), kept in fp32 (step.Norm), before it.
    In an fp32 model the two are the same arithmetic."""
    h = x.float()
    inv = torch.linalg.vector_norm(h, 2.0, [-1], True).square_().div_(h.shape[-1]).add_(eps).rsqrt_()
    if weight.dtype == x.dtype:
        return weight * (h * inv).to(x.dtype)
    return (h * inv * weight).to(x.dtype)


def attend_newest(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  visible: Optional[torch.Tensor]) -> torch.Tensor:
    """The newest token's attention: q [Hq, D] (already scaled) over keys/values [Hkv, T, D] -> [Hq * D].

    Every cached entry is at an earlier position, so the only mask is `visible` [Hkv, T] (None: all):
    per-head eviction and the sliding window (step.visible_entries).
    Two small matmuls per GQA group: at one query row this beats the fused SDPA kernel.
    A packed layer (keys [1, N, D], visible [Hkv, N]) is one group of all Hq heads, each masked to
    the entries its kv head owns."""
    kv_heads, head_dim = keys.shape[0], keys.shape[2]
    scores = torch.matmul(q.reshape(kv_heads, -1, head_dim), keys.transpose(1, 2))  # [Hkv, G, T]
    if visible is not None:  # [Hkv, T]
        if visible.shape[0] == kv_heads:
            seen = visible[:, None, :]  # [Hkv, 1, T]
        else:
            seen = visible.repeat_interleave(q.shape[0] // visible.shape[0], dim=0)[None]  # [1, Hq, N]
        scores = scores.masked_fill(~seen, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if weights.dtype != values.dtype:
        weights = weights.to(values.dtype)
    return torch.matmul(weights, values).reshape(-1)  # [Hkv, G, D] -> [Hq * D]


def decode_layer(hidden: torch.Tensor, rotation: torch.Tensor,
                 norms: List[torch.Tensor], eps: float,  # [input norm, post-attention norm] weights
                 ffn_norms: Optional[List[torch.Tensor]],  # Gemma 3: [pre-, post-feedforward norm] weights
                 kinds: List[int], mats: List[List[torch.Tensor]], pad_rows: int,  # qkv, o, gate_up, down
                 activation: int,  # SILU (0) or GELU_TANH (1)
                 qkv_bias: Optional[torch.Tensor], qk_norms: List[torch.Tensor], qk_eps: float,  # Qwen2; q/k norms
                 heads: int, kv_heads: int, head_dim: int, intermediate: int, scaling: float,
                 keys: List[torch.Tensor], values: List[torch.Tensor], masks: List[Optional[torch.Tensor]],
                 key_slots: List[torch.Tensor], value_slots: List[torch.Tensor]) -> torch.Tensor:
    rows, qk_width = hidden.shape[0], (heads + kv_heads) * head_dim
    qkv = apply_linear(rms_norm(hidden, norms[0], eps), kinds[0], mats[0], pad_rows).to(hidden.dtype)
    if qkv_bias is not None:
        qkv = qkv + qkv_bias
    qk = qkv[:, :qk_width].reshape(rows, heads + kv_heads, head_dim)  # [B, Hq + Hkv, D]
    v = qkv[:, qk_width:].reshape(rows, kv_heads, 1, head_dim)  # [B, Hkv, 1, D]
    if len(qk_norms) > 0:
        qk = torch.cat([rms_norm(qk[:, :heads], qk_norms[0], qk_eps), rms_norm(qk[:, heads:], qk_norms[1], qk_eps)], 1)
    qk = torch.bmm(qk, rotation)  # row b rotated at its position
    q = qk[:, :heads]  # [B, Hq, D]
    scaled = q * scaling
    outs: List[torch.Tensor] = []
    for b in range(rows):
        key_slots[b].copy_(qk[b, heads:, None])
        value_slots[b].copy_(v[b])
        outs.append(attend_newest(scaled[b], keys[b], values[b], masks[b]))
    attn = apply_linear(torch.stack(outs), kinds[1], mats[1], pad_rows)  # [B, hidden]
    if ffn_norms is None:  # Llama: the post-attention norm is the MLP's input norm
        hidden.add_(attn)
        mlp_in = rms_norm(hidden, norms[1], eps)
    else:  # Gemma 3: the attention's output is normed before the residual
        hidden.add_(rms_norm(attn.to(hidden.dtype), norms[1], eps))
        mlp_in = rms_norm(hidden, ffn_norms[0], eps)
    gate_up = apply_linear(mlp_in, kinds[2], mats[2], pad_rows)  # [B, 2 I]
    gate = gate_up[:, :intermediate].float()
    acted = F.silu(gate) if activation == 0 else F.gelu(gate, approximate="tanh")  # SILU, GELU_TANH
    mlp = apply_linear(acted * gate_up[:, intermediate:], kinds[3], mats[3], pad_rows)  # [B, hidden]
    if ffn_norms is None:
        hidden.add_(mlp)
    else:
        hidden.add_(rms_norm(mlp.to(hidden.dtype), ffn_norms[1], eps))
    return q


decode_layer_eager = decode_layer
with warnings.catch_warnings():  # torch marks TorchScript deprecated; it is the measured fastest here
    warnings.simplefilter("ignore", DeprecationWarning)
    decode_layer = torch.jit.script(decode_layer_eager)
