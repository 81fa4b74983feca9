"""Shared-base LoRA KV: the math (pure functions with shapes) and the adapter forward that feeds it.

For a LoRA on k_proj, the adapter model's key at a layer is

    K_adapter = rope(X_a W_k^T + s (X_a A^T) B^T)          X_a: the adapter model's normed input [T, hidden]

The `shared` storage scheme keeps K_base = rope(X_b W_k^T) (the base model's chunk block, one for
every adapter) and per adapter only P = X_a A^T [T, r], and rebuilds

    K ~= K_base + rope(s P B^T)                              V likewise, no rope

RoPE is linear, so rotating the delta at the chunk's positions 0..n-1 and adding it to the
post-RoPE base key is the same as rotating the sum. The one approximation is X_a W ~ X_b W:
exact at layer 0 (both models embed and normalize the tokens identically) and for B = 0;
after layer 0 the adapter's q/k/v/o changes move X_a away from X_b and the error grows.
The low-rank parts are stored as a ChunkKV-shaped block: keys = P_k [L, 1, T, r], values = P_v.
"""

from __future__ import annotations

import torch

from kvstore.kv import ChunkKV
from kvstore.rope import apply_rope, rope_cos_sin
from workers.lora.adapter import LoraAdapter
from workers.runner import ModelRunner


def lora_delta(p: torch.Tensor, b: torch.Tensor, scaling: float, num_kv_heads: int) -> torch.Tensor:
    """p: [T, r], b: [Hkv*D, r] -> s * p b^T as [Hkv, T, D] (not rotated)."""
    delta = (p.float() @ b.float().T) * scaling  # [T, Hkv*D]
    return delta.view(p.shape[0], num_kv_heads, -1).transpose(0, 1)


def rope_at_chunk_positions(x: torch.Tensor, inv_freq: torch.Tensor, rope_scale: float = 1.0) -> torch.Tensor:
    """x: [H, T, D] un-rotated -> rotated at positions 0..T-1, scaled like ModelRunner.qkv does."""
    cos, sin = rope_cos_sin(torch.arange(x.shape[-2], device=x.device), inv_freq.to(x.device))  # [T, D]
    return apply_rope(x, cos * rope_scale, sin * rope_scale)


def _check_linear_kv(runner: ModelRunner) -> None:
    if getattr(runner.layers[0].self_attn, "k_norm", None) is not None:
        raise ValueError("shared LoRA KV needs K linear in the projection; this model normalizes keys (Qwen3)")


@torch.inference_mode()
def adapter_chunk(runner: ModelRunner, adapter: LoraAdapter, token_ids: list[int]) -> tuple[ChunkKV, ChunkKV]:
    """One forward of the adapter model over a chunk at 0..n-1.

    `runner` runs the adapter model (AdapterModels.runner_for). Returns (full KV, low-rank parts):
    full is [L, Hkv, T, D] as ModelRunner.chunk_kv gives; parts keys/values are P_k, P_v [L, 1, T, r].
    """
    _check_linear_kv(runner)
    p_k, p_v = [], []

    def take_parts(layer: int, hidden: torch.Tensor) -> None:
        x = runner.layers[layer].input_layernorm(hidden).float()  # X_a [T, hidden]
        p_k.append(x @ adapter.a(layer, "k_proj").to(x.device).T if "k_proj" in adapter.targets else x[:, :0])
        p_v.append(x @ adapter.a(layer, "v_proj").to(x.device).T if "v_proj" in adapter.targets else x[:, :0])

    full = runner.chunk_kv(token_ids, layer_input=take_parts)
    parts = ChunkKV(keys=torch.stack(p_k)[:, None], values=torch.stack(p_v)[:, None], token_ids=list(token_ids))
    return full, parts


@torch.inference_mode()
def reconstruct(runner: ModelRunner, base: ChunkKV, parts: ChunkKV, adapter: LoraAdapter) -> ChunkKV:
    """K = K_base + rope(s P_k B_k^T), V = V_base + s P_v B_v^T, one layer at a time.

    base: the base model's chunk KV [L, Hkv, T, D]; parts: P_k, P_v as [L, 1, T, r].
    Only one layer's delta exists at a time; the result is a new ChunkKV (base is not modified).
    """
    _check_linear_kv(runner)
    if parts.token_ids != base.token_ids or parts.num_layers != base.num_layers:
        raise ValueError("low-rank parts and base KV are for different chunks")
    keys, values = base.keys.clone(), base.values.clone()
    heads = base.keys.shape[1]
    for layer in range(base.num_layers):
        if "k_proj" in adapter.targets:
            dk = lora_delta(parts.keys[layer, 0].to(keys.device), adapter.b(layer, "k_proj").to(keys.device),
                            adapter.scaling, heads)
            keys[layer] += rope_at_chunk_positions(dk, runner.layer_inv_freq(layer), runner.rope_scale).to(keys.dtype)
        if "v_proj" in adapter.targets:
            dv = lora_delta(parts.values[layer, 0].to(values.device), adapter.b(layer, "v_proj").to(values.device),
                            adapter.scaling, heads)
            values[layer] += dv.to(values.dtype)
    return ChunkKV(keys=keys, values=values, token_ids=list(base.token_ids))


def relative_error_per_layer(approx: ChunkKV, exact: ChunkKV) -> tuple[list[float], list[float]]:
    """||approx - exact||_F / ||exact||_F per layer, for keys and for values."""
    def rel(a: torch.Tensor, e: torch.Tensor) -> list[float]:
        a, e = a.float().flatten(1), e.float().flatten(1)
        return ((a - e).norm(dim=1) / e.norm(dim=1).clamp_min(1e-12)).tolist()

    return rel(approx.keys, exact.keys), rel(approx.values, exact.values)
