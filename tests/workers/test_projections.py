"""Prefill kernels (workers/projections.py): the bf16 projections against the model's own fp32 modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ragkv.cli import build_parser
from ragkv.commands.serve import config_from_args
from ragkv.config import ServeConfig
from workers.cache import KVCache
from workers.engine import Engine, EngineConfig
from workers.projections import (AUTO, DEFAULT_PREFILL_KERNEL, EXACT_PREFILL_KERNEL, PREFILL_KERNELS, Bf16Matrix,
                                kernel_fingerprint, native_bf16, prefill_kernel_names, resolve_prefill_kernel)

TEXT = ("The lighthouse on Varrow Point was built in 1871. Its keeper, Ada Penhallow, kept a log of every ship "
        "that passed. The secret code of the archive is 48213. Question: what is the secret code? Answer:")


def test_with_kernel_shares_the_model_and_is_built_once(runner):
    fast = runner.with_kernel("bf16")
    assert fast is runner.with_kernel("bf16") and fast.with_kernel("fp32") is runner
    assert fast.model is runner.model and (runner.kernel, fast.kernel) == ("fp32", "bf16")
    with pytest.raises(ValueError, match="--prefill-kernel"):
        runner.with_kernel("int3")


def test_auto_is_bf16_only_where_the_hardware_has_it(runner, monkeypatch):
    """`auto` resolves by the device's bf16 support (with AVX512-BF16, attention in bf16 too), and a runner asked
    for it is the resolved kernel's runner."""
    expected = "fp32"
    if native_bf16(runner.device):
        expected = "bf16-attention" if torch.cpu._is_avx512_bf16_supported() else "bf16"
    assert resolve_prefill_kernel(AUTO, runner.device) == expected and runner.with_kernel(AUTO).kernel == expected
    assert runner.with_kernel(AUTO) is runner.with_kernel(expected)
    assert kernel_fingerprint("abc", AUTO) == kernel_fingerprint("abc", resolve_prefill_kernel(AUTO))
    assert resolve_prefill_kernel("bf16", runner.device) == "bf16"  # a named kernel is never second-guessed
    for avx512_bf16, amx, kernel in ((True, False, "bf16-attention"), (False, True, "bf16"), (False, False, "fp32")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda has=avx512_bf16: has)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda has=amx: has)
        assert resolve_prefill_kernel(AUTO, "cpu") == kernel
    with pytest.raises(ValueError, match="--prefill-kernel"):
        resolve_prefill_kernel("int3")


def test_bf16_projections_are_close_to_the_modules(runner):
    fast = runner.with_kernel("bf16").projections
    x = torch.randn(7, runner.shape.hidden_size)
    for layer in (0, runner.shape.num_layers - 1):
        for got, want in zip(fast.qkv(layer, x), runner.projections.qkv(layer, x)):
            assert got.dtype == torch.float32 and got.shape == want.shape
            assert (got - want).norm() / want.norm() < 1e-2
        want = runner.projections.mlp(layer, x)
        assert (fast.mlp(layer, x) - want).norm() / want.norm() < 2e-2


@pytest.mark.skipif(not native_bf16("cpu"), reason="oneDNN packs bf16 weights only where the CPU multiplies bf16")
def test_packed_bf16_weights_give_f_linear_bit_for_bit(runner):
    """oneDNN's packed layout changes how the weight is read, not the products: every row count a prefill uses
    (1 row: a logits call; a blend's few; a full prefill's many) gives F.linear's result exactly."""
    weight = runner.model.model.layers[3].mlp.gate_proj.weight
    matrix = Bf16Matrix.cast(weight)
    assert matrix.packed
    plain = weight.detach().to(torch.bfloat16)
    for rows in (1, 7, 65, 300):
        x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
        assert torch.equal(matrix(x), torch.nn.functional.linear(x, plain))


@pytest.mark.parametrize("model", ["runner", "gemma_runner"])
def test_the_bf16_mlp_is_its_matrices_and_activation_bit_for_bit(model, request):
    """The MLP's activation runs in place over the fp32 copy of gate|up where it is SiLU (SmolLM2; Gemma 3's
    GELU-tanh does not): the same bits as act(gate) * up out of place."""
    runner = request.getfixturevalue(model).with_kernel("bf16")
    lay = runner.projections.layers[2]
    for rows in (1, 33, 300):
        x = torch.randn(rows, runner.model.config.hidden_size, generator=torch.Generator().manual_seed(rows))
        gate, up = lay.gate_up(x.to(torch.bfloat16)).float().chunk(2, dim=-1)
        want = lay.down((lay.act(gate) * up).to(torch.bfloat16)).float()
        assert torch.equal(runner.projections.mlp(2, x), want)


@pytest.mark.parametrize("model", ["runner", "gemma_runner"])
@pytest.mark.parametrize("kernel", ["fp32", "bf16"])
def test_kv_alone_is_qkvs_k_and_v_bit_for_bit(model, kernel, request):
    """Blend's choice of tokens takes fresh K/V without the queries (runner.kv): the same K and V as the
    layer's own qkv, bit for bit, under both kernels and with Gemma 3's k_norm, so the choice is unchanged."""
    runner = request.getfixturevalue(model).with_kernel(kernel)
    x = torch.randn(37, runner.shape.hidden_size, generator=torch.Generator().manual_seed(5))
    positions = torch.arange(100, 137)
    for layer in (0, runner.shape.num_layers // 2):
        _, k, v = runner.qkv(layer, x, positions)
        k_alone, v_alone = runner.kv(layer, x, positions)
        assert torch.equal(k, k_alone) and torch.equal(v, v_alone)


def test_bf16_head_is_close_to_the_models(runner):
    """The bf16 kernel's LM head (the tied embedding cast to bf16) against the model's fp32 one."""
    hidden = runner.model.model.norm(torch.randn(3, runner.shape.hidden_size, generator=torch.Generator().manual_seed(0)))
    want = runner.projections.head(hidden)
    got = runner.with_kernel("bf16").projections.head(hidden)
    assert got.dtype == torch.float32 and got.shape == want.shape == (3, runner.shape.vocab_size)
    assert (got - want).norm() / want.norm() < 1e-2
    assert torch.equal(want, runner.model.lm_head(hidden).float())  # fp32: the module itself


@pytest.mark.parametrize("kernel", ["bf16", "bf16-attention"])
def test_bf16_prefill_keeps_the_next_token_distribution(runner, kernel):
    ids = torch.tensor(runner.tokenize(TEXT))
    positions = torch.arange(len(ids))
    exact = runner.forward(ids, positions, KVCache.empty(runner.shape.num_layers))
    fast = runner.with_kernel(kernel).forward(ids, positions, KVCache.empty(runner.shape.num_layers))
    p, q = torch.log_softmax(exact.reshape(-1), -1), torch.log_softmax(fast.reshape(-1), -1)
    assert int(exact.argmax()) == int(fast.argmax())
    assert float((p.exp() * (p - q)).sum()) < 0.01  # KL(exact || bf16) in nats


def test_bf16_attention_is_the_bf16_attention_kernels_alone(runner, monkeypatch):
    """Every layer of a bf16-attention prefill runs the row kernel's bf16 arithmetic on a CPU with AVX512-BF16 (fp32
    elsewhere); fp32 and bf16 always attend in fp32. Its blocks have an address of their own."""
    from workers import row_attention
    if row_attention.unavailable() is not None:
        pytest.skip(row_attention.unavailable())
    calls, attend_rows = [], row_attention.attend_rows
    monkeypatch.setattr(row_attention, "attend_rows", lambda *a, bf16=False: calls.append(bf16) or attend_rows(*a, bf16=bf16))
    ids = torch.tensor(runner.tokenize(TEXT))
    assert len({kernel_fingerprint("abc", k) for k in PREFILL_KERNELS}) == len(PREFILL_KERNELS)
    for kernel, want in (("fp32", False), ("bf16", False),
                         ("bf16-attention", row_attention.bf16_fits(runner.shape.head_dim))):
        calls.clear()
        runner.with_kernel(kernel).forward(ids, torch.arange(len(ids)), KVCache.empty(runner.shape.num_layers))
        assert calls == [want] * runner.shape.num_layers, kernel


def test_the_kernel_is_part_of_every_block_address(runner, tmp_path):
    """The two kernels' KV differ in their bytes: one store holds both, neither reads the other's blocks."""
    assert kernel_fingerprint("abc", EXACT_PREFILL_KERNEL) == "abc" != kernel_fingerprint("abc", "bf16")
    store = f"disk:{tmp_path / 'blocks'}"
    exact = Engine(EngineConfig(store=store, prefill_kernel="fp32"), runner=runner)
    fast = Engine(EngineConfig(store=store, prefill_kernel="bf16"), runner=runner)
    try:
        (ref_exact,), (ref_fast,) = exact.ingest(["A chunk about lighthouses."]), fast.ingest(["A chunk about lighthouses."])
        assert ref_exact.id != ref_fast.id and not ref_fast.cached
        assert fast.runner.kernel == "bf16" and exact.runner.kernel == "fp32"
    finally:
        exact.close()
        fast.close()


def test_flag_env_and_helm_follow_the_registry(monkeypatch):
    assert ServeConfig().engine.prefill_kernel == DEFAULT_PREFILL_KERNEL in prefill_kernel_names()
    args = build_parser("serve").parse_args(["serve", "--prefill-kernel", "fp32"])
    assert config_from_args(args).engine.prefill_kernel == "fp32"
    monkeypatch.setenv("RAGKV_PREFILL_KERNEL", "fp32")
    assert ServeConfig.from_env().engine.prefill_kernel == "fp32"
    with pytest.raises(ValueError, match="--prefill-kernel"):
        ServeConfig().with_overrides(prefill_kernel="int3")
    schema = json.loads((Path(__file__).parents[2] / "helm/ragkv/values.schema.json").read_text())
    assert set(schema["properties"]["server"]["properties"]["prefillKernel"]["enum"]) == set(prefill_kernel_names())
    assert set(prefill_kernel_names()) == {AUTO, *PREFILL_KERNELS}
