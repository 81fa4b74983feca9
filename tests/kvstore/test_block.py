"""Block framing: round trip, and every kind of damage is a BlockError, never KV."""

from __future__ import annotations

import json
import struct

import lz4.block
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore_helpers import tiny_kv
from kvstore import block
from kvstore.block import (BlockError, BlockFingerprintError, BlockFormatError,
                           BlockShapeError, BlockTruncatedError, BlockVersionError, decode_block, encode_block)
from kvstore.codecs import CODECS, make_codec

FP = "f" * 64


PREFIX = struct.Struct("<4sHHII")  # magic, version, flags, header_len, token_count


def reframe(header: dict, payload: bytes, flags: int = 0, version: int = block.FORMAT_VERSION) -> bytes:
    """Build a block with a *valid* checksum around a forged header (what an attacker can do).
    `header["token_ids"]` go in the binary u32 section after the JSON, the rest in the JSON."""
    fields = dict(header)
    tokens = fields.pop("token_ids", [])
    raw = json.dumps(fields).encode()
    body = PREFIX.pack(block.MAGIC, version, flags, len(raw), len(tokens)) + raw
    body += struct.pack(f"<{len(tokens)}I", *tokens) + payload
    return body + block._digest(body)


def split(data: bytes) -> tuple[dict, bytes]:
    """The header as a dict (token ids included) and the stored payload."""
    _, _, _, n, count = PREFIX.unpack_from(data)
    h = json.loads(data[PREFIX.size:PREFIX.size + n])
    h["token_ids"] = list(struct.unpack_from(f"<{count}I", data, PREFIX.size + n))
    return h, data[PREFIX.size + n + 4 * count:-block.CHECKSUM_BYTES]


def test_reframe_matches_the_encoder():
    data = encode_block(tiny_kv(tokens=6), make_codec("int8"), FP)
    h, payload = split(data)
    assert h["token_ids"] == tiny_kv(tokens=6).token_ids
    assert decode_block(reframe(h, payload))[0].token_ids == h["token_ids"]


@pytest.mark.parametrize("name", sorted(CODECS))
def test_round_trip_keeps_tokens_and_header(name):
    kv = tiny_kv(tokens=7)
    data = encode_block(kv, make_codec(name), FP)
    out, header = decode_block(data, expected_fingerprint=FP)
    assert out.token_ids == kv.token_ids
    assert out.keys.shape == kv.keys.shape and out.keys.dtype == kv.keys.dtype
    assert header.codec == name and header.fingerprint == FP and header.shape == tuple(kv.keys.shape)


def test_every_flipped_byte_is_detected():
    data = encode_block(tiny_kv(tokens=5), make_codec("int8"), FP)
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x41
        with pytest.raises(BlockError):
            decode_block(bytes(bad))


def test_truncation_is_detected():
    data = encode_block(tiny_kv(tokens=20), make_codec("fp16"), FP)
    for n in (0, 3, 11, 12, 40, len(data) // 2, len(data) - 33, len(data) - 1):
        with pytest.raises(BlockError):
            decode_block(data[:n])
    with pytest.raises(BlockTruncatedError):
        decode_block(data[: len(data) - 100])


def test_wrong_magic_version_and_fingerprint():
    data = encode_block(tiny_kv(), make_codec("kivi2"), FP)
    with pytest.raises(BlockFormatError):
        decode_block(b"XXXX" + data[4:])
    with pytest.raises(BlockVersionError):
        decode_block(data[:4] + struct.pack("<H", 99) + data[6:])
    with pytest.raises(BlockFingerprintError):
        decode_block(data, expected_fingerprint="0" * 64)
    decode_block(data)  # no expectation: any fingerprint


def test_forged_headers_with_valid_checksum_are_refused_before_allocating():
    kv = tiny_kv(tokens=4)
    data = encode_block(kv, make_codec("fp16"), FP)
    h, payload = split(data)
    huge = dict(h, shape=[1 << 20, 1 << 10, 4, 1 << 10])
    with pytest.raises(BlockShapeError):
        decode_block(reframe(huge, payload))
    with pytest.raises(BlockShapeError):  # token count disagrees with shape
        decode_block(reframe(dict(h, token_ids=[1, 2]), payload))
    with pytest.raises(BlockFormatError):
        decode_block(reframe(dict(h, raw_len=-1), payload))
    with pytest.raises(BlockShapeError):  # unknown codec parameter
        decode_block(reframe(dict(h, codec_params={"evil": 1}), payload))
    # lz4 bomb: 1 KiB of compressed zeros claiming to expand to 1 GiB
    bomb = lz4.block.compress(b"\0" * (1 << 20), store_size=False)
    big = dict(h, shape=[1, 1, 4, (1 << 30) // 16], raw_len=1 << 30, stored_len=len(bomb), token_ids=[1, 2, 3, 4])
    with pytest.raises(BlockError):
        decode_block(reframe(big, bomb, flags=block.FLAG_LZ4))
    # token id above MAX_TOKEN_ID (the u32 section can hold more)
    with pytest.raises(BlockFormatError):
        decode_block(reframe(dict(h, token_ids=[1, 2, 3, block.MAX_TOKEN_ID + 1]), payload))
    decode_block(reframe(dict(h, token_ids=[1, 2, 3, block.MAX_TOKEN_ID]), payload))  # the bound itself is fine
    # header length / token count fields larger than the data
    with pytest.raises(BlockError):
        decode_block(PREFIX.pack(block.MAGIC, block.FORMAT_VERSION, 0, 1 << 31, 0) + b"\0" * 64)
    for count in (17, 1 << 20, 1 << 31):
        with pytest.raises(BlockError):
            decode_block(PREFIX.pack(block.MAGIC, block.FORMAT_VERSION, 0, 2, count) + b"{}" + b"\0" * 64)


def test_encoder_refuses_token_ids_out_of_range():
    kv = tiny_kv(tokens=2)
    for bad in ([-1, 2], [1, block.MAX_TOKEN_ID + 1]):
        kv.token_ids = bad
        with pytest.raises(ValueError):
            encode_block(kv, make_codec("int8"), FP)


@pytest.mark.parametrize("version", [1, 2])
def test_old_version_blocks_are_refused(version):
    # version 2 had no pre-RoPE keys: its bytes would decode, so the version alone must refuse them
    data = encode_block(tiny_kv(), make_codec("kivi2"), FP)
    with pytest.raises(BlockVersionError):
        decode_block(reframe(*split(data), version=version))


def test_old_version_and_corrupt_blocks_are_store_misses():
    from kvstore.backends import open_backend
    from kvstore.store import BlockStore

    kv = tiny_kv(tokens=6)
    store = BlockStore(open_backend("memory:"), make_codec("kivi2", pre_rope=True), FP)
    old, bad = store.address_for(kv.token_ids), store.address_for(kv.token_ids, namespace="n")
    data = store.encode(kv)
    store.put_raw(old, reframe(*split(data), version=2))
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 1
    store.put_raw(bad, bytes(damaged))
    assert store.get(old) is None and store.get(bad) is None
    assert store.stats()["corrupt"] == 2 and not store.contains(old) and not store.contains(bad)
    store.put_raw(old, data)
    assert store.get(old).pre_rope


def test_pre_rope_block_carries_its_frequencies():
    kv = tiny_kv(tokens=7)
    data = encode_block(kv, make_codec("kivi2", pre_rope=True), FP)
    out, header = decode_block(data)
    assert out.pre_rope and header.inv_freq == tuple(kv.inv_freq.tolist())
    assert torch.equal(out.inv_freq, kv.inv_freq)
    h, payload = split(data)
    for forged in ([1.0, 2.0], ["x"] * 4, [1.0, 2.0, 3.0, True]):  # head_dim 8 -> 4 finite numbers
        with pytest.raises(BlockFormatError, match="inv_freq"):
            decode_block(reframe(dict(h, inv_freq=forged), payload))
    with pytest.raises(BlockShapeError, match="inv_freq"):  # a pre-RoPE codec without frequencies
        decode_block(reframe(dict(h, inv_freq=None), payload))
    post, _ = split(encode_block(kv, make_codec("kivi2", pre_rope=False), FP))
    with pytest.raises(BlockShapeError, match="inv_freq"):  # frequencies on a post-RoPE block
        decode_block(reframe(dict(post, inv_freq=h["inv_freq"]), payload))


def test_lz4_only_when_it_shrinks():
    zeros = tiny_kv(tokens=64)
    zeros.keys.zero_()
    zeros.values.zero_()
    _, h = decode_block(encode_block(zeros, make_codec("fp16"), FP))
    assert h.lz4 and h.stored_len < h.raw_len
    _, h = decode_block(encode_block(tiny_kv(tokens=64), make_codec("kivi2"), FP))
    assert not h.lz4 and h.stored_len == h.raw_len


VALID = [encode_block(tiny_kv(tokens=t, seed=t), make_codec(name), FP)
         for name in sorted(CODECS) for t in (1, 3)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_bytes_never_crash(data):
    with pytest.raises(BlockError):
        decode_block(data)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(range(len(VALID))), st.data())
def test_mutated_blocks_are_errors_or_the_original(i, draw):
    data = bytearray(VALID[i])
    kind = draw.draw(st.sampled_from(["flip", "cut", "splice"]))
    if kind == "flip":
        for pos in draw.draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=4)):
            data[pos] ^= draw.draw(st.integers(1, 255))
    elif kind == "cut":
        data = data[: draw.draw(st.integers(0, len(data) - 1))]
    else:
        pos = draw.draw(st.integers(0, len(data)))
        data[pos:pos] = draw.draw(st.binary(min_size=1, max_size=64))
    try:
        kv, header = decode_block(bytes(data))
    except BlockError:
        return
    want, _ = decode_block(VALID[i])  # only a no-op mutation may decode, and then to the same KV
    assert kv.keys.shape == want.keys.shape == header.shape
    assert torch.equal(kv.keys, want.keys) and torch.equal(kv.values, want.values)
