"""wk4v3: the bit allocation math, plans in block headers and addresses, and plan errors."""

from __future__ import annotations

import itertools

import pytest
import torch

from kvstore.address import chunk_address
from kvstore.block import BlockShapeError, decode_block, encode_block, frame_block
from kvstore.codecs import CodecError, make_codec, quant
from kvstore.codecs.allocation import allocate, distortion, parse_plan, plan_string
from kvstore.codecs.planned import width_groups
from kvstore.kv import ChunkKV

LEVELS = (2, 3, 4, 8)


def test_allocation_is_optimal_on_a_small_case():
    """Brute force over every width assignment of 4 channels at 13 bits: the greedy one is as good."""
    weight = torch.tensor([5.0, 0.01, 40.0, 1.0])
    widths = allocate(weight, 13, LEVELS)
    best = min(float(distortion(weight, torch.tensor(c)).sum())
               for c in itertools.product(LEVELS, repeat=4) if sum(c) <= 13)
    assert int(widths.sum()) <= 13
    assert float(distortion(weight, widths).sum()) == pytest.approx(best)


def test_allocation_spends_the_budget_and_follows_the_weights():
    weight = torch.rand(500, generator=torch.Generator().manual_seed(0)) ** 4 * 1e3
    widths = allocate(weight, int(4.125 * 500), LEVELS)
    assert set(widths.tolist()) <= set(LEVELS)
    assert 4.1 * 500 <= int(widths.sum()) <= 4.125 * 500
    order = torch.argsort(weight)
    assert bool((widths[order][1:] >= widths[order][:-1]).all())  # a heavier channel never gets fewer bits


def test_equal_weights_get_equal_widths_and_too_few_bits_are_refused():
    assert allocate(torch.ones(64), 4 * 64, LEVELS).tolist() == [4] * 64
    with pytest.raises(ValueError, match="cannot give"):
        allocate(torch.ones(64), 64, LEVELS)


def test_plan_strings_round_trip_and_are_checked():
    widths = torch.tensor(LEVELS * 6).reshape(2, 3, 4)
    assert torch.equal(parse_plan(plan_string(widths), (2, 3, 4)), widths)
    with pytest.raises(ValueError, match="24 channels"):
        parse_plan("4" * 23, (2, 3, 4))
    with pytest.raises(ValueError, match="among"):
        parse_plan("5" * 24, (2, 3, 4))
    with pytest.raises(ValueError, match="key_plan"):
        make_codec("wk4v3", key_plan="4x")


def _kv(shape=(2, 3, 20, 64), seed=0) -> ChunkKV:
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    return ChunkKV(keys, values, list(range(shape[2])), inv_freq=1.0 / (1e4 ** (torch.arange(0, 64, 2) / 64)))


def test_wider_channels_are_stored_more_exactly_and_the_bytes_follow_the_plan():
    kv = _kv()
    widths = torch.tensor([2, 8] * 32).repeat(2, 3, 1)  # [L, H, D]: every other channel 8-bit
    codec = make_codec("wk4v3", key_plan=plan_string(widths))
    payload = codec.encode(kv.with_rope(True).keys, kv.values)
    assert len(payload) == codec.payload_size((2, 3, 20, 64))
    keys, _ = codec.decode(payload, (2, 3, 20, 64), torch.float32)
    err = (keys - kv.with_rope(True).keys).abs().mean(dim=(0, 1, 2))  # [D]
    assert float(err[1::2].max()) < float(err[0::2].min()) / 10
    uniform = make_codec("wk4v3")  # 4 bits each: 2 + 8 average to 5, so the plan costs one bit a channel more
    extra = codec.payload_size((2, 3, 20, 64)) - uniform.payload_size((2, 3, 20, 64))
    assert extra == 2 * 3 * 64 * 20 // 8


def test_keys_decode_to_the_per_channel_formula_bit_for_bit():
    """Under a plan of every width, at a token count that is not a multiple of 8 (whole key groups and a short
    last one): each key channel decodes to code * scale + zero of its own group, exactly, in its place."""
    shape = (2, 3, 21, 64)
    kv = _kv(shape, seed=3).with_rope(True)
    widths = torch.tensor(LEVELS * 16).repeat(2, 3, 1)[..., torch.randperm(64, generator=torch.Generator().manual_seed(1))]
    codec = make_codec("wk4v3", key_plan=plan_string(widths), key_group=8)
    parts = codec.encode_parts(kv.keys, kv.values)
    keys, _ = codec.decode(codec.encode(kv.keys, kv.values), shape, torch.float32)
    channels = torch.empty(2 * 3 * 64, 21)  # [C, T]
    for k, (bits, idx) in enumerate(width_groups(codec.key_plan, 2, 3, 64)):
        codes, scale, zero = parts[3 * k: 3 * k + 3]  # [R, T, bits], [R, 8, NG], [R, 8, NG]
        q = quant.unpack_bits(codes, bits).transpose(1, 2).float()  # [R, 8, T]
        x = q * quant._expand_groups(scale.float(), 8, 21) + quant._expand_groups(zero.float(), 8, 21)
        channels[idx] = x.reshape(-1, 21)[: idx.numel()]
    assert torch.equal(keys, channels.view(2, 3, 64, 21).transpose(2, 3))


def test_a_block_carries_its_plan_and_plans_are_part_of_the_address():
    kv = _kv()
    plan_a = plan_string(torch.full((2, 3, 64), 4))
    plan_b = plan_string(torch.tensor([3, 4, 4, 8] * 16).repeat(2, 3, 1))
    a, b = make_codec("wk4v3", key_plan=plan_a), make_codec("wk4v3", key_plan=plan_b)
    decoded, header = decode_block(encode_block(kv, b, "f" * 64))
    assert header.codec_params["key_plan"] == plan_b and decoded.pre_rope
    assert chunk_address("f" * 64, kv.token_ids, a.spec()) != chunk_address("f" * 64, kv.token_ids, b.spec())


def test_a_plan_for_another_shape_is_a_codec_error_and_its_block_a_miss():
    kv = _kv()
    codec = make_codec("wk4v3", key_plan="4" * (2 * 3 * 64 + 1))
    with pytest.raises(CodecError, match="channels"):
        codec.payload_size((2, 3, 20, 64))
    good = make_codec("wk4v3", key_plan="4" * (2 * 3 * 64))
    raw = good.encode(kv.with_rope(True).keys, kv.values)
    framed = frame_block(kv.with_rope(True), codec, "f" * 64, raw)  # checksummed, but its plan fits no [2, 3, 64]
    with pytest.raises(BlockShapeError, match="channels"):
        decode_block(framed)
