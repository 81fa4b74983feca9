"""One decode step for a batch of requests: every running request's next token in one forward.

The projections and the MLP run once over all rows ([B, hidden]) through batch-invariant kernels
(linear.py), so the weights are read once per step, not once per request. Each layer is one
scripted function (layer.py); this file builds its arguments and walks the layers. Attention runs per row,
each over its own position-tagged cache, so blended, evicted and per-head caches work unchanged,
and a row's arithmetic is the same in a batch of 16 as alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from kvstore.rope import rope_cos_sin
from workers.batching.layer import decode_layer, rms_norm
from workers.batching.linear import DECODE_KERNELS, DecodeLinear
from workers.cache import KVCache


@dataclass
class Norm:
    """An RMSNorm's weight and epsilon."""

    weight: torch.Tensor
    eps: float

    @classmethod
    def of(cls, module: torch.nn.Module) -> "Norm":
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if eps is None:
            raise ValueError(f"decode step: {type(module).__name__} is not an RMSNorm with an epsilon")
        return cls(module.weight.detach(), float(eps))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


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
    qk_norms: tuple[Norm, Norm] | None  # Qwen3: per-head norms of q and k before RoPE

    def arguments(self) -> tuple:
        """decode_layer's weight arguments, in its order (built once)."""
        linears = (self.qkv, self.o, self.gate_up, self.down)
        pad_rows = max(lin.pad_rows for lin in linears)
        qk_norms = [self.qk_norms[0].weight, self.qk_norms[1].weight] if self.qk_norms else []
        return ([self.input_norm.weight, self.post_norm.weight], self.input_norm.eps, [lin.kind for lin in linears],
                [lin.tensors for lin in linears], pad_rows, self.qkv_bias, qk_norms,
                self.qk_norms[0].eps if self.qk_norms else 0.0)


@dataclass
class DecodeWeights:
    """The model's weights in one decode kernel's form (built once per engine)."""

    kernel: str
    layers: list[DecodeLayer]
    lm_head: DecodeLinear
    final_norm: Norm
    intermediate: int  # MLP width: gate_up's first half is the gate
    arguments: list[tuple] = field(init=False)  # per layer: DecodeLayer.arguments(), derived from `layers`

    def __post_init__(self) -> None:
        self.arguments = [layer.arguments() for layer in self.layers]

    def kernels_used(self) -> dict[str, int]:
        """How many matrices each kernel serves (a matrix that does not pack exactly falls back to fp32)."""
        counts: dict[str, int] = {}
        for lin in [self.lm_head] + [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]:
            counts[lin.kernel] = counts.get(lin.kernel, 0) + 1
        return counts


def build_decode_weights(runner, kernel: str, pad_rows: int) -> DecodeWeights:
    make = DECODE_KERNELS[kernel]
    act = getattr(runner.model.config, "hidden_act", "silu")
    if act != "silu":  # decode_layer's MLP; every supported (Llama-family) architecture uses it
        raise ValueError(f"decode step: MLP activation {act!r} is not 'silu'")
    layers = []
    for block in runner.layers:
        attn, mlp = block.self_attn, block.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach().float()
        norms = (Norm.of(attn.q_norm), Norm.of(attn.k_norm)) if getattr(attn, "q_norm", None) is not None else None
        layers.append(DecodeLayer(make(qkv, pad_rows), bias, make(attn.o_proj.weight, pad_rows),
                                  make(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), pad_rows),
                                  make(mlp.down_proj.weight, pad_rows), Norm.of(block.input_layernorm),
                                  Norm.of(block.post_attention_layernorm), float(attn.scaling), norms))
    return DecodeWeights(kernel, layers, make(runner.model.lm_head.weight, pad_rows), Norm.of(runner.model.model.norm),
                         runner.layers[0].mlp.gate_proj.weight.shape[0])


@torch.inference_mode()
def decode_step(runner, weights: DecodeWeights, token_ids: Sequence[int], positions: Sequence[int],
                caches: Sequence[KVCache], observers: Sequence | None = None, layer_fn=decode_layer) -> torch.Tensor:
    """Row b: token_ids[b] at positions[b] appended to caches[b] -> logits [B, vocab] (fp32).

    observers[b] (or None) sees row b's queries and KV per layer, as in ModelRunner.forward (after
    the layer: attention only reads the cache). `layer_fn` is decode_layer (scripted) or
    decode_layer_eager (the same source)."""
    shape, device = runner.shape, runner.device
    rows, heads, kv_heads, head_dim = len(token_ids), shape.num_heads, shape.num_kv_heads, shape.head_dim
    observers = observers or [None] * rows
    pos = torch.tensor(list(positions), device=device)  # [B]
    row_pos = [pos[b:b + 1] for b in range(rows)]
    hidden = runner.embed(torch.tensor(list(token_ids), device=device))  # [B, hidden]
    rotation = rope_matrix(pos, runner.inv_freq.to(device), runner.rope_scale).to(hidden.dtype)  # [B, D, D]
    for index, (layer, arguments) in enumerate(zip(weights.layers, weights.arguments)):
        kvs = [cache.layers[index] for cache in caches]
        slots = [kv.reserve(row_pos[b], hidden.dtype, hidden.dtype) for b, kv in enumerate(kvs)]
        q = layer_fn(hidden, rotation, *arguments, heads, kv_heads, head_dim, weights.intermediate, layer.scaling,
                     [kv.keys for kv in kvs], [kv.values for kv in kvs], [kv.head_mask for kv in kvs],
                     [slot[0] for slot in slots], [slot[1] for slot in slots])
        for b, observer in enumerate(observers):
            if observer is not None:
                observer(index, q[b][:, None], row_pos[b], kvs[b])
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

