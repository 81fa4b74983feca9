"""Shared-base reconstruction: exact where the math says it is, and the adapter model is the peft model."""

from __future__ import annotations

import torch

from workers.lora import adapter_chunk, reconstruct, relative_error_per_layer
from workers.lora.lowrank import lora_delta, rope_at_chunk_positions


def test_rope_of_delta_matches_runner_rope(runner):
    """rope(K_pre + d) == rope(K_pre) + rope(d): the delta is rotated exactly like the runner rotates keys."""
    torch.manual_seed(0)
    normed = torch.randn(5, runner.shape.hidden_size)
    positions = torch.arange(5)
    _, k, _ = runner.qkv(0, normed, positions)
    k_pre = runner.layers[0].self_attn.k_proj(normed).view(5, runner.shape.num_kv_heads, -1).transpose(0, 1)
    torch.testing.assert_close(rope_at_chunk_positions(k_pre, runner.inv_freq, runner.rope_scale), k,
                               rtol=1e-5, atol=1e-5)


def test_lora_delta_shapes():
    p, b = torch.randn(7, 4), torch.randn(3 * 64, 4)
    d = lora_delta(p, b, 2.0, num_kv_heads=3)
    assert d.shape == (3, 7, 64)
    torch.testing.assert_close(d.transpose(0, 1).reshape(7, -1), 2.0 * p @ b.T)


def test_full_layout_is_the_peft_model(runner, models, adapters, chunk_ids):
    """The adapter forward equals a plain forward of the peft model (its KV via the runner's own chunk_kv)."""
    adapter, _ = adapters
    adapter_runner = models.runner_for(adapter)
    full, _ = adapter_chunk(adapter_runner, adapter, chunk_ids)
    torch.testing.assert_close(full.keys, adapter_runner.chunk_kv(chunk_ids).keys)
    base = runner.chunk_kv(chunk_ids)
    assert (full.keys[1:] - base.keys[1:]).abs().max() > 1e-3  # the adapter does change the cache


def test_reconstruction_exact_at_layer_zero(runner, models, adapters, chunk_ids):
    adapter, _ = adapters
    base = runner.chunk_kv(chunk_ids)
    full, parts = adapter_chunk(models.runner_for(adapter), adapter, chunk_ids)
    rebuilt = reconstruct(runner, base, parts, adapter)
    k_err, v_err = relative_error_per_layer(rebuilt, full)
    k_base, v_base = relative_error_per_layer(base, full)
    assert k_err[0] < 1e-5 and v_err[0] < 1e-5
    assert k_base[0] > 1e-3 and v_base[0] > 1e-3  # the base cache alone is not the adapter's at layer 0
    assert max(k_err[1:]) > 1e-4  # and later layers are an approximation (hidden states drift)


def test_reconstruction_exact_for_zero_b(runner, models, adapters, chunk_ids):
    _, zero = adapters
    base = runner.chunk_kv(chunk_ids)
    full, parts = adapter_chunk(models.runner_for(zero), zero, chunk_ids)
    rebuilt = reconstruct(runner, base, parts, zero)
    torch.testing.assert_close(rebuilt.keys, full.keys, rtol=0, atol=1e-6)
    torch.testing.assert_close(rebuilt.values, full.values, rtol=0, atol=1e-6)


def test_runner_model_left_without_adapters(runner, models):
    assert type(runner.layers[0].self_attn.k_proj) is torch.nn.Linear
    assert not hasattr(runner.model, "peft_config")
