"""One decode step for a batch of requests: every running request's next token in one forward.

The projections and the MLP run once over all rows ([B, hidden]) through batch-invariant kernels
(linear.py), so the weights are read once per step, not once per request. Attention runs per row,
each over its own position-tagged cache, so blended, evicted and per-head caches work unchanged,
and a row's arithmetic is the same in a batch of 16 as alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from kvstore.rope import rope_cos_sin
from workers.batching.linear import DECODE_KERNELS, DecodeLinear
from workers.cache import KVCache


@dataclass
class DecodeLayer:
    qkv: DecodeLinear  # hidden -> [q | k | v]
    qkv_bias: torch.Tensor | None  # Qwen2
    o: DecodeLinear
    gate_up: DecodeLinear  # hidden -> [gate | up]
    down: DecodeLinear


@dataclass
class DecodeWeights:
    """The model's weights in one decode kernel's form (built once per engine)."""

    kernel: str
    layers: list[DecodeLayer]
    lm_head: DecodeLinear
    intermediate: int  # MLP width: gate_up's first half is the gate

    def kernels_used(self) -> dict[str, int]:
        """How many matrices each kernel serves (a matrix that does not pack exactly falls back to fp32)."""
        counts: dict[str, int] = {}
        for lin in [self.lm_head] + [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]:
            counts[lin.kernel] = counts.get(lin.kernel, 0) + 1
        return counts


def build_decode_weights(runner, kernel: str, pad_rows: int) -> DecodeWeights:
    make = DECODE_KERNELS[kernel]
    layers = []
    for block in runner.layers:
        attn, mlp = block.self_attn, block.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach().float()
        layers.append(DecodeLayer(make(qkv, pad_rows), bias, make(attn.o_proj.weight, pad_rows),
                                  make(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), pad_rows),
                                  make(mlp.down_proj.weight, pad_rows)))
    return DecodeWeights(kernel, layers, make(runner.model.lm_head.weight, pad_rows),
                         runner.layers[0].mlp.gate_proj.weight.shape[0])


@torch.inference_mode()
def decode_step(runner, weights: DecodeWeights, token_ids: Sequence[int], positions: Sequence[int],
                caches: Sequence[KVCache], observers: Sequence | None = None) -> torch.Tensor:
    """Row b: token_ids[b] at positions[b] appended to caches[b] -> logits [B, vocab] (fp32).

    observers[b] (or None) sees row b's queries and KV per layer, as in ModelRunner.forward."""
    shape, device = runner.shape, runner.device
    rows, heads, kv_heads, head_dim = len(token_ids), shape.num_heads, shape.num_kv_heads, shape.head_dim
    observers = observers or [None] * rows
    pos = torch.tensor(list(positions), device=device)  # [B]
    row_pos = [pos[b:b + 1] for b in range(rows)]
    hidden = runner.embed(torch.tensor(list(token_ids), device=device))  # [B, hidden]
    rotation = rope_matrix(pos, runner.inv_freq.to(device), runner.rope_scale).to(hidden.dtype)  # [B, D, D]
    qk_width = (heads + kv_heads) * head_dim
    for index, layer in enumerate(weights.layers):
        block, attn = runner.layers[index], runner.layers[index].self_attn
        qkv = layer.qkv(rms_norm(block.input_layernorm, hidden)).float().to(hidden.dtype)  # [B, (Hq + 2 Hkv) * D]
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias
        qk = qkv[:, :qk_width].view(rows, heads + kv_heads, head_dim)  # [B, Hq + Hkv, D]
        v = qkv[:, qk_width:].view(rows, kv_heads, 1, head_dim)  # [B, Hkv, 1, D]
        if getattr(attn, "q_norm", None) is not None:  # Qwen3: per-head norms before RoPE
            qk = torch.cat([attn.q_norm(qk[:, :heads]), attn.k_norm(qk[:, heads:])], dim=1)
        qk = torch.bmm(qk, rotation)  # row b rotated at positions[b]
        q, k = qk[:, :heads], qk[:, heads:, None]  # [B, Hq, D], [B, Hkv, 1, D]
        outs = []
        for b in range(rows):
            kv = caches[b].update(index, k[b], v[b], row_pos[b])
            if observers[b] is not None:
                observers[b](index, q[b][:, None], row_pos[b], kv)
            outs.append(attend_newest(q[b], kv.keys, kv.values, attn.scaling, kv.head_mask))
        hidden.add_(layer.o(torch.stack(outs) if rows > 1 else outs[0][None]))
        gate_up = layer.gate_up(rms_norm(block.post_attention_layernorm, hidden))  # [B, 2 I]
        gate, up = gate_up[:, :weights.intermediate], gate_up[:, weights.intermediate:]
        hidden.add_(layer.down(block.mlp.act_fn(gate.float()) * up))
    return weights.lm_head(rms_norm(runner.model.model.norm, hidden)).float()


def rope_matrix(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """positions [B] -> R [B, D, D] with x @ R[b] == apply_rope(x, cos[b], sin[b]): RoPE as one matmul.

    Column j takes x_j cos_j and, from its pair in the other half, -x_(j+D/2) sin_j (j < D/2) or
    +x_(j-D/2) sin_j."""
    cos, sin = rope_cos_sin(positions, inv_freq)  # [B, D]
    cos, sin = cos * scale, sin * scale
    rows, dim = cos.shape
    half = dim // 2
    rotation = torch.diag_embed(cos)
    j = torch.arange(half, device=positions.device)
    rotation[:, j + half, j] = -sin[:, :half]
    rotation[:, j, j + half] = sin[:, half:]
    return rotation


def rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm module as one fused op (x: [B, hidden])."""
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None or x.dtype != torch.float32:
        return norm(x)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm.weight  # LlamaRMSNorm, in fewer ops


def attend_newest(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                  head_mask: torch.Tensor | None) -> torch.Tensor:
    """The newest token's attention: q [Hq, D] over keys/values [Hkv, T, D] -> [Hq * D].

    It sees every cached token (all are at earlier positions), so only per-head eviction masks.
    Two small matmuls per GQA group: at one query row this beats the fused SDPA kernel."""
    kv_heads, num_tokens, head_dim = keys.shape
    q = (q * scale).reshape(kv_heads, -1, head_dim)  # [Hkv, G, D]: query heads of one group share a KV head
    scores = torch.matmul(q, keys.transpose(1, 2))  # [Hkv, G, T]
    if head_mask is not None:  # [Hkv, T]
        scores = scores.masked_fill(~head_mask[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if weights.dtype != values.dtype:
        weights = weights.to(values.dtype)
    return torch.matmul(weights, values).reshape(-1)  # [Hkv, G, D] -> [Hq * D]
