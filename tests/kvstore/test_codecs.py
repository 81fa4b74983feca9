"""Every codec through one matrix on real KV, plus the quantization/packing math it is built from."""

from __future__ import annotations

import pytest
import torch

from kvstore.codecs import CODECS, CodecError, codec_from_spec, make_codec
from kvstore.codecs import quant

# (name, params, max relative L2 error of keys, of values) on real KV from the default model.
# Measured on this 85-token chunk: int8 (asymmetric, default) keys 0.0077 / values 0.0057,
# int8 symmetric 0.0109 / 0.0068, int4 0.100 / 0.082, int4 g16 0.073 / 0.067,
# kivi2 0.201 / 0.413 (keys per channel fare far better than values per token at 2 bits),
# kivi2 g16 + 16 fp16 residual tokens 0.145 / 0.304. Bounds leave ~10-20% headroom.
CASES = [
    ("fp16", {}, 1e-3, 1e-3),
    ("int8", {}, 0.01, 0.01),
    ("int8", {"symmetric": True}, 0.0125, 0.01),
    ("int4", {}, 0.115, 0.10),
    ("int4", {"group_size": 16}, 0.085, 0.08),
    ("kivi2", {}, 0.23, 0.46),
    ("kivi2", {"group_size": 16, "residual": 16}, 0.17, 0.35),
]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_every_registered_codec_is_in_the_matrix():
    assert {c[0] for c in CASES} == set(CODECS)


@pytest.mark.parametrize("name,params,k_bound,v_bound", CASES, ids=lambda x: str(x))
def test_round_trip_on_real_kv(real_kv, name, params, k_bound, v_bound):
    codec = make_codec(name, **params)
    shape = tuple(real_kv.keys.shape)
    payload = codec.encode(real_kv.keys, real_kv.values)
    assert len(payload) == codec.payload_size(shape)
    keys, values = codec.decode(payload, shape, real_kv.keys.dtype)
    assert keys.shape == real_kv.keys.shape and values.shape == real_kv.values.shape
    assert keys.dtype == real_kv.keys.dtype
    assert rel_err(keys, real_kv.keys) < k_bound
    assert rel_err(values, real_kv.values) < v_bound
    # deterministic bytes: the content address may rely on them
    assert codec.encode(real_kv.keys, real_kv.values) == payload


@pytest.mark.parametrize("name,params,_k,_v", CASES, ids=lambda x: str(x))
def test_decode_rejects_wrong_length(name, params, _k, _v):
    codec = make_codec(name, **params)
    shape = (2, 1, 8, 8)
    payload = codec.encode(torch.randn(shape), torch.randn(shape))
    for bad in (payload[:-1], payload + b"\0"):
        with pytest.raises(CodecError):
            codec.decode(bad, shape, torch.float32)


def test_size_ratios_vs_fp16():
    shape = (30, 3, 256, 64)
    fp16 = make_codec("fp16").payload_size(shape)
    assert make_codec("int8").payload_size(shape) / fp16 <= 0.55
    assert make_codec("int8", symmetric=True).payload_size(shape) / fp16 <= 0.55
    assert make_codec("int4").payload_size(shape) / fp16 == pytest.approx(0.3125)
    assert make_codec("kivi2").payload_size(shape) / fp16 == pytest.approx(0.1875)  # <= 1/5 at full key groups


def test_spec_and_registry_errors():
    assert codec_from_spec("kivi2") == codec_from_spec({"name": "kivi2", "params": {"group_size": 32, "residual": 0}})
    assert make_codec("kivi2").spec() == {"name": "kivi2", "params": {"group_size": 32, "residual": 0}}
    with pytest.raises(CodecError):
        make_codec("zstd9")
    with pytest.raises(CodecError):
        make_codec("int4", bits=3)
    with pytest.raises(ValueError):
        make_codec("int4", group_size=0)


# -- the math, called directly ---------------------------------------------------------

def test_pack_layouts_are_low_bits_first():
    q = torch.tensor([[1, 2, 3, 0, 3, 3, 3, 3]], dtype=torch.uint8)
    assert quant.pack_2bit(q).tolist() == [[1 | 2 << 2 | 3 << 4, 255]]
    assert quant.pack_4bit(torch.tensor([[1, 15, 0, 7]], dtype=torch.uint8)).tolist() == [[0xF1, 0x70]]
    r = torch.randint(0, 4, (3, 5, 64), dtype=torch.uint8)
    assert torch.equal(quant.unpack_2bit(quant.pack_2bit(r)), r)
    r = torch.randint(0, 16, (3, 5, 64), dtype=torch.uint8)
    assert torch.equal(quant.unpack_4bit(quant.pack_4bit(r)), r)


def test_partial_last_group_uses_its_own_statistics():
    # 33 tokens: one full key group and a 1-token tail. The tail's per-channel min == max,
    # so it is reproduced exactly (to fp16), whatever the first group holds.
    x = torch.randn(1, 1, 33, 8) * 10
    q, scale, zero = quant.quantize_per_channel(x, 2, 32)
    assert scale.shape == (1, 1, 8, 2)
    back = quant.dequantize_per_channel(q, scale, zero, 32)
    assert torch.allclose(back[:, :, 32], x[:, :, 32].half().float())


def test_asymmetric_quantization_error_within_half_step():
    x = torch.randn(4, 3, 40, 64)
    for bits in (2, 4, 8):
        q, scale, zero = quant.quantize_asym(x, bits, 32)
        err = (quant.dequantize_asym(q, scale, zero, 32) - x).abs()
        step = quant._expand_groups(scale.float(), 32, 64)
        assert (err <= step / 2 + 1e-2 * step + 1e-3).all()


def test_kivi2_residual_tokens_are_kept_in_fp16(real_kv):
    codec = make_codec("kivi2", residual=24)
    keys, values = codec.decode(codec.encode(real_kv.keys, real_kv.values), tuple(real_kv.keys.shape), torch.float32)
    assert torch.equal(keys[:, :, -24:], real_kv.keys[:, :, -24:].half().float())
    assert torch.equal(values[:, :, -24:], real_kv.values[:, :, -24:].half().float())
    assert not torch.equal(keys[:, :, :-24], real_kv.keys[:, :, :-24].half().float())
