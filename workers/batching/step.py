"""One decode step for a batch of requests: every running request's next token in one forward.

The projections and the MLP run once over all rows ([B, hidden]) through batch-invariant kernels
(linear.py), so the weights are read once per step, not once per request. Attention runs per row,
each over its own position-tagged cache, so blended, evicted and per-head caches work unchanged,
and a row's arithmetic is the same in a batch of 16 as alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from kvstore.rope import rope_cos_sin
from workers.batching.linear import DECODE_KERNELS, DecodeLinear
from workers.cache import KVCache


@dataclass
class Norm:
    """An RMSNorm's weight and epsilon (the module itself when it is not a plain LlamaRMSNorm)."""

    weight: torch.Tensor
    eps: float | None
    module: torch.nn.Module

    @classmethod
    def of(cls, module: torch.nn.Module) -> "Norm":
        return cls(module.weight, getattr(module, "variance_epsilon", None), module)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, hidden]: LlamaRMSNorm's arithmetic in fewer ops."""
        if self.eps is None or x.dtype != torch.float32:
            return self.module(x)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@dataclass
class DecodeLayer:
    """One decoder layer as the decode step uses it: its kernels and what it reads from the modules."""

    qkv: DecodeLinear  # hidden -> [q | k | v]
    qkv_bias: torch.Tensor | None  # Qwen2
    o: DecodeLinear
    gate_up: DecodeLinear  # hidden -> [gate | up]
    down: DecodeLinear
    input_norm: Norm
    post_norm: Norm
    scaling: float
    act: Callable[[torch.Tensor], torch.Tensor]
    qk_norms: tuple | None  # Qwen3: per-head norms of q and k before RoPE


@dataclass
class DecodeWeights:
    """The model's weights in one decode kernel's form (built once per engine)."""

    kernel: str
    layers: list[DecodeLayer]
    lm_head: DecodeLinear
    final_norm: Norm
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
        norms = (attn.q_norm, attn.k_norm) if getattr(attn, "q_norm", None) is not None else None
        layers.append(DecodeLayer(make(qkv, pad_rows), bias, make(attn.o_proj.weight, pad_rows),
                                  make(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), pad_rows),
                                  make(mlp.down_proj.weight, pad_rows), Norm.of(block.input_layernorm),
                                  Norm.of(block.post_attention_layernorm), attn.scaling, mlp.act_fn, norms))
    return DecodeWeights(kernel, layers, make(runner.model.lm_head.weight, pad_rows), Norm.of(runner.model.model.norm),
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
    qk_width, half = (heads + kv_heads) * head_dim, weights.intermediate
    layer_caches = [cache.layers for cache in caches]
    for index, layer in enumerate(weights.layers):
        qkv = layer.qkv(layer.input_norm(hidden)).float().to(hidden.dtype)  # [B, (Hq + 2 Hkv) * D]
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias
        qk = qkv[:, :qk_width].view(rows, heads + kv_heads, head_dim)  # [B, Hq + Hkv, D]
        v = qkv[:, qk_width:].view(rows, kv_heads, 1, head_dim)  # [B, Hkv, 1, D]
        if layer.qk_norms is not None:
            qk = torch.cat([layer.qk_norms[0](qk[:, :heads]), layer.qk_norms[1](qk[:, heads:])], dim=1)
        qk = torch.bmm(qk, rotation)  # row b rotated at positions[b]
        q, k = qk[:, :heads], qk[:, heads:, None]  # [B, Hq, D], [B, Hkv, 1, D]
        scaled = q * layer.scaling
        outs = []
        for b in range(rows):
            kv = layer_caches[b][index]
            kv.append(k[b], v[b], row_pos[b])
            if observers[b] is not None:
                observers[b](index, q[b][:, None], row_pos[b], kv)
            outs.append(attend_newest(scaled[b], kv.keys, kv.values, kv.head_mask))
        hidden.add_(layer.o(torch.stack(outs) if rows > 1 else outs[0][None]))
        gate_up = layer.gate_up(layer.post_norm(hidden))  # [B, 2 I]
        hidden.add_(layer.down(layer.act(gate_up[:, :half].float()) * gate_up[:, half:]))
    return weights.lm_head(weights.final_norm(hidden)).float()


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


def attend_newest(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  head_mask: torch.Tensor | None) -> torch.Tensor:
    """The newest token's attention: q [Hq, D] (already scaled) over keys/values [Hkv, T, D] -> [Hq * D].

    It sees every cached token (all are at earlier positions), so only per-head eviction masks.
    Two small matmuls per GQA group: at one query row this beats the fused SDPA kernel.
    A packed layer (keys [1, N, D], head_mask [Hkv, N]) is one group of all Hq heads, each masked to
    the entries its kv head owns."""
    kv_heads, num_tokens, head_dim = keys.shape
    scores = torch.matmul(q.reshape(kv_heads, -1, head_dim), keys.transpose(1, 2))  # [Hkv, G, T]
    if head_mask is not None:  # [Hkv, T]
        visible = (head_mask[:, None, :] if head_mask.shape[0] == kv_heads  # [Hkv, 1, T]
                   else head_mask.repeat_interleave(q.shape[0] // head_mask.shape[0], dim=0)[None])  # [1, Hq, N]
        scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if weights.dtype != values.dtype:
        weights = weights.to(values.dtype)
    return torch.matmul(weights, values).reshape(-1)  # [Hkv, G, D] -> [Hq * D]
