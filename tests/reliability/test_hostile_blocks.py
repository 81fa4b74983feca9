"""Forged blocks (valid checksum, lying header): the decoder refuses before allocating, never crashes,
never returns KV of a shape other than the header's. Complements tests/kvstore/test_block.py (random
and mutated bytes) with headers built to make the decoder allocate."""

from __future__ import annotations

import tracemalloc

import lz4.block
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults import reframe
from kvstore import block
from kvstore.block import BlockError, decode_block, encode_block
from kvstore.codecs import CodecError, make_codec
from kvstore.kv import ChunkKV

FP = "e" * 64
CODEC_NAMES = ("fp16", "int8", "int4", "kivi2", "wk4v3")


def _size(codec: str, shape) -> int:
    """What an honest header would declare; 0 where the codec refuses the shape (the decoder must too)."""
    try:
        return make_codec(codec).payload_size(tuple(shape))
    except CodecError:
        return 0


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    except BlockError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def _header(codec: str, shape, raw_len: int, stored_len: int, dtype="float16", tokens=None) -> dict:
    return {"codec": codec, "codec_params": make_codec(codec).params(), "shape": list(shape), "dtype": dtype,
            "fingerprint": FP, "token_ids": list(range(shape[2])) if tokens is None else tokens,
            "raw_len": raw_len, "stored_len": stored_len}


@pytest.mark.parametrize("codec", CODEC_NAMES)
def test_huge_claimed_shape_is_refused_before_any_allocation(codec):
    payload = b"\x00" * 1024
    for shape in ([1 << 20, 1 << 10, 4, 1 << 10], [30, 3, 64, 1 << 28], [1 << 30, 1, 4, 1]):
        size = _size(codec, shape)
        forged = reframe(_header(codec, shape, size, len(payload)), payload)
        with pytest.raises(BlockError):
            decode_block(forged)
        assert _peak_bytes(lambda: decode_block(forged)) < 4 << 20  # far below what the header asks for


def test_lz4_bomb_refused_before_decompressing():
    bomb = lz4.block.compress(b"\0" * (8 << 20), store_size=False)  # ~32 KiB that inflate to 8 MiB
    shape = [1, 1, 4, (1 << 30) // 16]
    forged = reframe(_header("fp16", shape, 1 << 30, len(bomb)), bomb, flags=block.FLAG_LZ4)
    with pytest.raises(BlockError):
        decode_block(forged)
    assert _peak_bytes(lambda: decode_block(forged)) < 4 << 20


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(codec=st.sampled_from(CODEC_NAMES),
       shape=st.tuples(st.integers(0, 1 << 12), st.integers(0, 64), st.integers(0, 64), st.integers(0, 1 << 12)),
       lie=st.sampled_from(["none", "raw_len", "stored_len", "tokens", "dtype"]),
       lz4=st.booleans(), payload=st.binary(max_size=4096), data=st.data())
def test_forged_headers_are_errors_or_kv_of_the_declared_shape(codec, shape, lie, lz4, payload, data):
    size = _size(codec, shape)
    raw_len, stored_len, tokens, dtype = size, len(payload), None, "float16"
    if lie == "raw_len":
        raw_len = data.draw(st.integers(0, block.MAX_RAW_BYTES))
    elif lie == "stored_len":
        stored_len = data.draw(st.integers(0, block.MAX_RAW_BYTES))
    elif lie == "tokens":
        tokens = data.draw(st.lists(st.integers(0, 1 << 31), max_size=70))
    elif lie == "dtype":
        dtype = data.draw(st.sampled_from(["float32", "bfloat16", "int64", "object"]))
    forged = reframe(_header(codec, shape, raw_len, stored_len, dtype, tokens), payload,
                     flags=block.FLAG_LZ4 if lz4 else 0)
    result = {}

    def decode():
        result["kv"] = decode_block(forged, expected_fingerprint=FP)

    peak = _peak_bytes(decode)
    assert peak < 16 << 20 + 300 * len(forged)  # bounded by what it was handed, not by the header
    if "kv" in result:
        kv, header = result["kv"]
        assert tuple(kv.keys.shape) == tuple(kv.values.shape) == tuple(shape) == header.shape
        assert len(kv.token_ids) == shape[2]


def test_valid_block_still_decodes():
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, 8, 2) / 8))  # a pre-RoPE codec (wk4v3) un-rotates with it
    kv = ChunkKV(torch.randn(2, 1, 3, 8), torch.randn(2, 1, 3, 8), [1, 2, 3], inv_freq=inv_freq)
    for codec in CODEC_NAMES:
        out, header = decode_block(encode_block(kv, make_codec(codec), FP), expected_fingerprint=FP)
        assert tuple(out.keys.shape) == (2, 1, 3, 8) and out.token_ids == [1, 2, 3]
