"""Every codec through one matrix on real KV, plus the quantization/packing math it is built from."""

from __future__ import annotations

import pytest
import torch

from kvstore.block import decode_block, encode_block
from kvstore.codecs import CODECS, CodecError, KiviCodec, codec_from_spec, make_codec
from kvstore.codecs import quant, rotation
from kvstore.kv import ChunkKV
from kvstore.rope import rerotate_keys

# (name, params, max relative L2 error of keys, of values) on real KV from the default model, keys compared
# rotated at 0..n-1 after a block round trip (pre-RoPE blocks are rotated back by ChunkKV.keys_at).
# Measured on this 85-token chunk [30, 3, 85, 64]: int8 (asymmetric, default) keys 0.0077 / values 0.0057,
# int8 symmetric 0.0109 / 0.0068, int4 0.100 / 0.082, int4 g16 0.073 / 0.067,
# kivi2 0.201 / 0.413 (keys per channel fare far better than values per token at 2 bits),
# kivi2 g16 + 16 fp16 residual tokens 0.145 / 0.304, kivi2 pre-RoPE 0.178 / 0.413;
# KIVI layout, keys (post-RoPE / pre-RoPE): 3 bit 0.0851 / 0.0754, 4 bit 0.0397 / 0.0352,
# g16 + 16 residual 4 bit 0.0286 / 0.0256; values 2 bit 0.413, 3 bit 0.177, 4 bit 0.0825.
# Rotated (Hadamard, key groups of 128 tokens, one value group of 64 channels; pre-RoPE keys by default): keys 4 bit
# 0.0433 (post-RoPE 0.0528), 3 bit 0.0931 (post 0.113); values 2 bit 0.448, 3 bit 0.191, 4 bit 0.0894 (the same groups unrotated: keys 0.0512, values
# 3 bit 0.208). wk4v3 (keys unrotated per channel, widths from a plan; values as hk4v3): no plan 0.0445 / 0.191,
# the default model's plan 0.0457 / 0.191 (its gain is in the query-weighted error: tests/workers/test_key_plan.py).
# Bounds leave ~10-20% headroom.
POST, PRE = {"pre_rope": False}, {"pre_rope": True}
CASES = [
    ("fp16", {}, 1e-3, 1e-3),
    ("fp32", {}, 1e-6, 1e-6),
    ("int8", {}, 0.01, 0.01),
    ("int8", {"symmetric": True}, 0.0125, 0.01),
    ("int4", {}, 0.115, 0.10),
    ("int4", {"group_size": 16}, 0.085, 0.08),
    ("kivi2", POST, 0.23, 0.46),
    ("kivi2", {"group_size": 16, "residual": 16, **POST}, 0.17, 0.35),
    ("kivi2", PRE, 0.20, 0.46),
    ("kivi2", {"key_group": 128, "value_group": 64, "rotate": True, **PRE}, 0.25, 0.50),  # rotated: 0.217 / 0.448
    ("wk4v3", {}, 0.05, 0.21),  # no plan: 4 bits a key channel, unrotated, pre-RoPE: keys 0.0445, values 0.191
]
KIVI_NAMES = sorted(name for name, cls in CODECS.items() if issubclass(cls, KiviCodec))


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
    # deterministic bytes: the content address may rely on them
    assert codec.encode(real_kv.keys, real_kv.values) == payload
    # through a block: pre-RoPE codecs store un-rotated keys and give them back as pre_rope ChunkKV
    data = encode_block(real_kv, codec, "f" * 64)
    kv, _ = decode_block(data)
    assert kv.pre_rope == codec.pre_rope and kv.keys.dtype == real_kv.keys.dtype
    assert rel_err(kv.keys_at(0), real_kv.keys) < k_bound
    assert rel_err(kv.values, real_kv.values) < v_bound
    assert encode_block(real_kv, codec, "f" * 64) == data


@pytest.mark.parametrize("name", KIVI_NAMES)
def test_pre_rope_keys_match_post_rope_keys_within_quantization_error(real_kv, runner, name):
    """Both forms give the same keys, up to their own quantization error, at any offset; pre-RoPE's is lower."""
    pre, _ = decode_block(encode_block(real_kv, make_codec(name, pre_rope=True), "f" * 64))
    post, _ = decode_block(encode_block(real_kv, make_codec(name, pre_rope=False), "f" * 64))
    assert pre.pre_rope and not post.pre_rope
    for start in (0, 37, 1000):
        exact = rerotate_keys(real_kv.keys, start, runner.inv_freq)
        err_pre = rel_err(pre.keys_at(start), exact)
        err_post = rel_err(post.keys_at(start, runner.inv_freq), exact)
        assert err_pre < err_post  # measured 11-13% lower at every width (see CASES)
        assert rel_err(pre.keys_at(start), post.keys_at(start, runner.inv_freq)) < err_pre + err_post


def test_pre_rope_transform_is_exact_without_quantization(real_kv):
    """Un-rotating at 0..n-1 and rotating back costs only float rounding."""
    pre = real_kv.with_rope(True)
    assert pre.pre_rope and rel_err(pre.keys, real_kv.keys) > 0.1  # really un-rotated
    assert rel_err(pre.keys_at(0), real_kv.keys) < 1e-6
    assert rel_err(pre.keys_at(21), rerotate_keys(real_kv.keys, 21, real_kv.inv_freq)) < 1e-6
    assert pre.with_rope(False).pre_rope is False


def test_pre_rope_codec_needs_the_keys_frequencies():
    kv = ChunkKV(torch.randn(2, 1, 4, 8), torch.randn(2, 1, 4, 8), [1, 2, 3, 4])  # inv_freq unknown
    with pytest.raises(ValueError, match="inv_freq"):
        encode_block(kv, make_codec("kivi2", pre_rope=True), "f" * 64)
    encode_block(kv, make_codec("kivi2", pre_rope=False), "f" * 64)
    with pytest.raises(ValueError, match="inv_freq"):
        ChunkKV(kv.keys, kv.values, kv.token_ids, pre_rope=True)


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
    # the other KIVI widths and the rotated codecs: research/tests/test_codecs.py


def test_spec_and_registry_errors():
    kivi2 = {"group_size": 32, "residual": 0, "pre_rope": False, "key_group": 0, "value_group": 0, "rotate": False}
    assert codec_from_spec("kivi2") == codec_from_spec({"name": "kivi2", "params": kivi2})
    assert make_codec("kivi2").spec() == {"name": "kivi2", "params": kivi2}
    assert make_codec("kivi2", pre_rope=True) != make_codec("kivi2", pre_rope=False)
    with pytest.raises(ValueError, match="pre_rope"):
        make_codec("kivi2", pre_rope=1)
    with pytest.raises(CodecError, match="head_dim"):
        make_codec("kivi2").payload_size((1, 1, 4, 6))  # 2-bit codes need head_dim % 4 == 0
    with pytest.raises(CodecError, match="'zstd9'"):
        make_codec("zstd9")
    with pytest.raises(CodecError):
        make_codec("int4", bits=3)
    with pytest.raises(ValueError):
        make_codec("int4", group_size=0)


def test_rotated_codec_fields_are_checked():
    rotated = {"pre_rope": True, "key_group": 128, "value_group": 64, "rotate": True}  # the hk* layout (research)
    assert make_codec("kivi2", **rotated).params() == {"group_size": 32, "residual": 0, **rotated}
    assert make_codec("kivi2", **rotated) != make_codec("kivi2", **{**rotated, "rotate": False})
    with pytest.raises(CodecError, match="power-of-two head_dim"):
        make_codec("kivi2", **rotated).payload_size((1, 1, 4, 48))
    with pytest.raises(ValueError, match="key_group"):
        make_codec("kivi2", key_group=-1)
    with pytest.raises(ValueError, match="rotate"):
        make_codec("kivi2", rotate="yes")


# -- the math, called directly ---------------------------------------------------------

def test_rotation_is_orthogonal_and_undone():
    for dim in (2, 64, 128):
        r = rotation.rotation(dim, "cpu").double()
        torch.testing.assert_close(r @ r.T, torch.eye(dim, dtype=torch.float64), atol=1e-6, rtol=0)
    x = torch.randn(3, 5, 64)
    assert rel_err(rotation.unrotate(rotation.rotate(x)), x) < 1e-6
    assert rel_err(rotation.rotate(x), x) > 0.5  # really mixes channels
    spiky = torch.zeros(1, 64)
    spiky[0, 7] = 8.0  # one outlier channel is spread over all channels
    assert rotation.rotate(spiky).abs().max() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="power-of-two"):
        rotation.check_dim(96)


def test_pack_layouts_are_low_bits_first():
    q = torch.tensor([[1, 2, 3, 0, 3, 3, 3, 3]], dtype=torch.uint8)
    assert quant.pack_bits(q, 2).tolist() == [[1 | 2 << 2 | 3 << 4, 255]]
    assert quant.pack_bits(torch.tensor([[1, 15, 0, 7]], dtype=torch.uint8), 4).tolist() == [[0xF1, 0x70]]
    # 3 bit: a little-endian stream, code 2 straddles bytes 0 and 1
    q3 = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0]], dtype=torch.uint8)
    stream = sum(int(c) << (3 * i) for i, c in enumerate(q3[0]))
    assert quant.pack_bits(q3, 3).tolist() == [[stream & 255, stream >> 8 & 255, stream >> 16]]
    for bits in quant.PACK_BITS:
        r = torch.randint(0, 1 << bits, (3, 5, 64), dtype=torch.uint8)
        assert quant.pack_bits(r, bits).shape == (3, 5, 8 * bits)
        assert torch.equal(quant.unpack_bits(quant.pack_bits(r, bits), bits), r)
    with pytest.raises(ValueError, match="bits"):
        quant.pack_bits(q, 5)
    with pytest.raises(ValueError, match="divisible by 8"):
        quant.pack_bits(q[:, :4], 3)


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
    for bits in (2, 3, 4, 8):
        q, scale, zero = quant.quantize_asym(x, bits, 32)
        err = (quant.dequantize_asym(q, scale, zero, 32) - x).abs()
        step = quant._expand_groups(scale.float(), 32, 64)
        assert (err <= step / 2 + 1e-2 * step + 1e-3).all()


@pytest.mark.parametrize("group", [64, 32, 24])  # whole vector, two groups, a short last group
def test_dequantization_is_the_scale_and_zero_formula_bit_for_bit(group):
    """Decode runs in place over one fp32 copy of the codes; it must equal code * scale + zero exactly
    (the Triton kernels are held to it) and leave the codes as they were."""
    q, scale, zero = quant.quantize_asym(torch.randn(2, 3, 40, 64), 4, group)
    codes = q.clone()
    formula = q.float() * quant._expand_groups(scale.float(), group, 64) + quant._expand_groups(zero.float(), group, 64)
    assert torch.equal(quant.dequantize_asym(q, scale, zero, group), formula)
    assert torch.equal(q, codes)
    q8, scale8 = quant.quantize_sym(torch.randn(2, 3, 40, 64))
    assert torch.equal(quant.dequantize_sym(q8, scale8), q8.float() * scale8.float())


@pytest.mark.parametrize("name", KIVI_NAMES)
def test_kivi_residual_tokens_are_kept_in_fp16(real_kv, name):
    codec = make_codec(name, residual=24)
    keys, values = codec.decode(codec.encode(real_kv.keys, real_kv.values), tuple(real_kv.keys.shape), torch.float32)
    assert torch.equal(keys[:, :, -24:], real_kv.keys[:, :, -24:].half().float())
    assert torch.equal(values[:, :, -24:], real_kv.values[:, :, -24:].half().float())
    assert not torch.equal(keys[:, :, :-24], real_kv.keys[:, :, :-24].half().float())
