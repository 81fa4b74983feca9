"""kvstore/kernels/dequant.c (native_quant.py): a CPU's dequantize gives the torch reference's values bit for bit,
every width, group and shape the codecs use; `auto` takes it, `torch` and RAGKV_FORCE_TORCH keep the reference,
and every codec decodes the same block to the same tensors either way."""

from __future__ import annotations

import pytest
import torch

from kvstore.codecs import CODECS, make_codec
from kvstore.kernels import dispatch, native_quant, reference

pytestmark = pytest.mark.skipif(native_quant.unavailable() is not None, reason=f"{native_quant.unavailable()}")


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group,tokens", [(32, 128), (128, 131), (8, 13), (64, 1)])
def test_the_c_kernels_give_the_references_values(bits, group, tokens):
    torch.manual_seed(bits * 100 + tokens)
    x = torch.randn(2, 3, tokens, 64) * 3 + 0.5
    codes, scale, zero = reference.quantize_token(x, bits, group)
    assert torch.equal(native_quant.dequantize(codes, scale, zero, bits, group, per_channel=False),
                       reference.dequantize_token(codes, scale, zero, bits, group))
    codes, scale, zero = reference.quantize_channel(x, bits, group)
    assert torch.equal(native_quant.dequantize(codes, scale, zero, bits, group, per_channel=True),
                       reference.dequantize_channel(codes, scale, zero, bits, group))


def test_wk4v3_rows_and_unleaded_codes():
    """wk4v3's keys: rows of 8 channels, codes [R, T, bits] (no head axis); and plain [T, width] codes."""
    torch.manual_seed(1)
    x = torch.randn(90, 128, 8)
    for bits in (2, 3, 4, 8):
        codes, scale, zero = reference.quantize_channel(x, bits, 128)
        assert torch.equal(native_quant.dequantize(codes, scale, zero, bits, 128, per_channel=True),
                           reference.dequantize_channel(codes, scale, zero, bits, 128))
    codes, scale, zero = reference.quantize_token(x[0], 4, 8)
    assert torch.equal(native_quant.dequantize(codes, scale, zero, 4, 8, per_channel=False),
                       reference.dequantize_token(codes, scale, zero, 4, 8))


def test_auto_runs_the_kernels_and_torch_keeps_the_reference(monkeypatch):
    torch.manual_seed(2)
    codes, scale, zero = reference.quantize_token(torch.randn(3, 40, 64), 3, 64)
    calls, dequantize = [], native_quant.dequantize
    monkeypatch.setattr(native_quant, "dequantize", lambda *a, **k: calls.append(1) or dequantize(*a, **k))
    want = reference.dequantize_token(codes, scale, zero, 3, 64)
    assert torch.equal(dispatch.dequantize_token(codes, scale, zero, 3, 64), want) and calls == [1]
    assert torch.equal(dispatch.dequantize_token(codes, scale, zero, 3, 64, backend="torch"), want) and calls == [1]
    monkeypatch.setenv("RAGKV_FORCE_TORCH", "1")
    assert torch.equal(dispatch.dequantize_token(codes, scale, zero, 3, 64), want) and calls == [1]
    monkeypatch.delenv("RAGKV_FORCE_TORCH")
    assert not native_quant.fits(codes, 12, per_channel=False)  # token groups must hold whole 8-code runs
    out = dispatch.dequantize_token(codes, scale, zero, 3, 64, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want.to(torch.bfloat16))


@pytest.mark.parametrize("name", sorted(CODECS))
def test_every_codec_decodes_alike_with_and_without_the_kernels(name, monkeypatch):
    torch.manual_seed(3)
    shape = (2, 3, 37, 64)
    keys, values = torch.randn(shape), torch.randn(shape)
    codec = make_codec(name)
    payload = codec.encode(keys, values)
    fast = codec.decode(payload, shape, torch.float32)
    monkeypatch.setenv("RAGKV_FORCE_TORCH", "1")
    slow = codec.decode(payload, shape, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
