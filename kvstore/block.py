"""Block framing: one chunk's encoded KV as a self-describing, checksummed byte string.

Layout (integers little-endian):

    0   magic          4 bytes  b"RKVB"
    4   version        u16      FORMAT_VERSION
    6   flags          u16      bit 0: payload is lz4-compressed (lz4 block format)
    8   header_len     u32      <= MAX_HEADER_BYTES
    12  token_count    u32      <= MAX_TOKENS
    16  header         header_len bytes of UTF-8 JSON (see BlockHeader; token ids are not in it)
    ..  token_ids      token_count u32s, each <= MAX_TOKEN_ID
    ..  payload        header["stored_len"] bytes
    -16 checksum       xxh3-128 over every byte before it (prefix + header + token ids + payload)

Token ids are binary, not JSON: a hit parses them with one array copy and
checks them with builtin min/max, where a JSON list of 256 ids cost more than
the checksum (version 1 kept them in the JSON header; it is no longer read).

A block is decoded only after its lengths add up against the real data size
and its checksum matches; every failure is a BlockError, never KV. The checksum
catches accidental damage (bit rot, torn or truncated writes). It is xxh3-128,
not sha256: a cryptographic hash would not make it an authenticator (anyone who
can write the store can recompute it), and at ~0.6 GB/s sha256 would cost more
than reading the block from the page cache; xxh3 verifies at tens of GB/s. The
content address stays sha256 (kvstore/address.py). Since it is not an
authenticator, so the decoder also refuses headers that would make it allocate
far more than it was handed (forged shapes, lz4 bombs).
"""

from __future__ import annotations

import json
import math
import struct
import sys
from array import array
from dataclasses import dataclass

import lz4.block
import torch
import xxhash

from kvstore.codecs import Codec, CodecError, make_codec
from kvstore.kv import ChunkKV

MAGIC = b"RKVB"
FORMAT_VERSION = 2
FLAG_LZ4 = 1
_PREFIX = struct.Struct("<4sHHII")  # magic, version, flags, header_len, token_count
CHECKSUM_BYTES = 16
MAX_HEADER_BYTES = 1 << 20  # JSON header without token ids: codec, params, shape, fingerprint
MAX_TOKENS = 1 << 21
TOKEN_BYTES = 4
MAX_RAW_BYTES = 1 << 30  # decoded payload cap: a forged header can't ask for more
LZ4_MAX_RATIO = 256  # lz4 cannot expand data by more than ~255x
MAX_TOKEN_ID = 1 << 31
# Keep lz4 only when it saves at least this fraction: decompressing costs more than a few % of bytes.
LZ4_MIN_SAVING = 1 / 32

DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_U32 = next(code for code in "IL" if array(code).itemsize == TOKEN_BYTES)
_SWAP = sys.byteorder != "little"


class BlockError(ValueError):
    """The bytes are not a usable block. Never turned into KV."""


class BlockFormatError(BlockError):
    """Wrong magic, malformed header, or fields out of range."""


class BlockVersionError(BlockError):
    """A block format version this code does not read."""


class BlockTruncatedError(BlockError):
    """Fewer bytes than the framing declares."""


class BlockChecksumError(BlockError):
    """The bytes were damaged after they were written."""


class BlockShapeError(BlockError):
    """The payload does not match the declared codec, shape or token count."""


class BlockFingerprintError(BlockError):
    """The block was computed by a different model."""


@dataclass(frozen=True)
class BlockHeader:
    version: int
    codec: str
    codec_params: dict
    shape: tuple[int, int, int, int]  # [layers, kv_heads, tokens, head_dim]
    dtype: str
    fingerprint: str
    token_ids: list[int]
    lz4: bool
    raw_len: int  # codec payload length
    stored_len: int  # bytes in the block (== raw_len unless lz4)

    def to_json(self) -> bytes:
        """The JSON header section (everything but the token ids, which follow it in binary)."""
        return json.dumps({
            "codec": self.codec, "codec_params": self.codec_params, "shape": list(self.shape),
            "dtype": self.dtype, "fingerprint": self.fingerprint,
            "raw_len": self.raw_len, "stored_len": self.stored_len,
        }, separators=(",", ":"), sort_keys=True).encode()


def pack_token_ids(token_ids) -> bytes:
    """Token ids as little-endian u32s; ValueError unless each is an int in [0, MAX_TOKEN_ID]."""
    try:
        ids = array(_U32, token_ids)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"token ids must be ints in [0, {MAX_TOKEN_ID}]: {e}") from None
    if len(ids) > MAX_TOKENS:
        raise ValueError(f"{len(ids)} token ids exceed {MAX_TOKENS}")
    if ids and max(ids) > MAX_TOKEN_ID:
        raise ValueError(f"token ids must be ints in [0, {MAX_TOKEN_ID}]")
    if _SWAP:
        ids.byteswap()
    return ids.tobytes()


def _digest(data) -> bytes:
    return xxhash.xxh3_128_digest(data)


def encode_block(kv: ChunkKV, codec: Codec, fingerprint: str) -> bytes:
    if kv.keys.dtype not in DTYPE_NAMES:
        raise ValueError(f"unsupported KV dtype {kv.keys.dtype}")
    raw = codec.encode(kv.keys, kv.values)
    stored, flags = raw, 0
    if raw:
        packed = lz4.block.compress(raw, store_size=False)
        if len(packed) <= len(raw) * (1 - LZ4_MIN_SAVING):
            stored, flags = packed, FLAG_LZ4
    token_ids = [int(t) for t in kv.token_ids]
    tokens = pack_token_ids(token_ids)
    header = BlockHeader(
        version=FORMAT_VERSION, codec=codec.name, codec_params=codec.params(), shape=tuple(kv.keys.shape),
        dtype=DTYPE_NAMES[kv.keys.dtype], fingerprint=fingerprint, token_ids=token_ids,
        lz4=bool(flags & FLAG_LZ4), raw_len=len(raw), stored_len=len(stored),
    ).to_json()
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"block header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    body = b"".join((_PREFIX.pack(MAGIC, FORMAT_VERSION, flags, len(header), len(token_ids)), header, tokens, stored))
    return body + _digest(body)


def _int(value, name: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BlockFormatError(f"header field {name}={value!r} out of range [{lo}, {hi}]")
    return value


def _parse_header(view: memoryview, version: int, flags: int, header_len: int, token_count: int) -> BlockHeader:
    """Parse the JSON header and the token ids after it. The caller has checked both fit in `view`."""
    start = _PREFIX.size
    tokens_at = start + header_len
    try:
        h = json.loads(str(view[start:tokens_at], "utf-8"))  # one copy, straight to str
    except (UnicodeDecodeError, ValueError) as e:
        raise BlockFormatError(f"header is not JSON: {e}") from None
    if not isinstance(h, dict):
        raise BlockFormatError("header is not a JSON object")
    ids = array(_U32)
    ids.frombytes(view[tokens_at:tokens_at + token_count * TOKEN_BYTES])
    if _SWAP:
        ids.byteswap()
    # builtins over the array, not a call per token: this runs on every cache hit
    if token_count and max(ids) > MAX_TOKEN_ID:
        raise BlockFormatError(f"token_ids must be ints in [0, {MAX_TOKEN_ID}]")
    try:
        shape = h["shape"]
        if not isinstance(shape, list) or len(shape) != 4:
            raise BlockFormatError(f"shape must be 4 ints, got {shape!r}")
        shape = tuple(_int(s, "shape", 0, MAX_RAW_BYTES) for s in shape)
        if h["dtype"] not in DTYPES:
            raise BlockFormatError(f"dtype {h['dtype']!r} not one of {sorted(DTYPES)}")
        if not isinstance(h["codec"], str) or not isinstance(h["codec_params"], dict):
            raise BlockFormatError("codec must be a name and codec_params an object")
        if not isinstance(h["fingerprint"], str):
            raise BlockFormatError("fingerprint must be a string")
        return BlockHeader(
            version=version, codec=h["codec"], codec_params=h["codec_params"], shape=shape, dtype=h["dtype"],
            fingerprint=h["fingerprint"], token_ids=ids.tolist(), lz4=bool(flags & FLAG_LZ4),
            raw_len=_int(h["raw_len"], "raw_len", 0, MAX_RAW_BYTES),
            stored_len=_int(h["stored_len"], "stored_len", 0, MAX_RAW_BYTES),
        )
    except KeyError as e:
        raise BlockFormatError(f"header lacks field {e}") from None
    except TypeError as e:  # e.g. an unhashable dtype
        raise BlockFormatError(f"header field of the wrong type: {e}") from None


def read_header(data: bytes) -> tuple[BlockHeader, memoryview]:
    """Check framing, lengths and checksum; return the header and the stored payload bytes."""
    view = memoryview(data)
    size = len(view)
    if size < _PREFIX.size + CHECKSUM_BYTES:
        raise BlockTruncatedError(f"{size} bytes is shorter than an empty block")
    magic, version, flags, header_len, token_count = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise BlockFormatError(f"bad magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise BlockVersionError(f"block format version {version}, this reader reads {FORMAT_VERSION}")
    if flags & ~FLAG_LZ4:
        raise BlockFormatError(f"unknown flags {flags:#x}")
    if header_len > MAX_HEADER_BYTES:
        raise BlockFormatError(f"header length {header_len} exceeds {MAX_HEADER_BYTES}")
    if token_count > MAX_TOKENS:
        raise BlockFormatError(f"token count {token_count} exceeds {MAX_TOKENS}")
    body_end = size - CHECKSUM_BYTES
    payload_at = _PREFIX.size + header_len + token_count * TOKEN_BYTES
    if payload_at > body_end:
        raise BlockTruncatedError(f"header of {header_len} bytes and {token_count} token ids "
                                  f"do not fit in {size} bytes")
    if _digest(view[:body_end]) != view[body_end:]:
        # Say "truncated" when the damage is a short read, so operators see the cause.
        try:
            declared = _parse_header(view, version, flags, header_len, token_count).stored_len
        except BlockError:
            declared = None
        if declared is not None and payload_at + declared > body_end:
            raise BlockTruncatedError(f"block is {size} bytes, header declares a longer payload")
        raise BlockChecksumError("checksum mismatch")
    header = _parse_header(view, version, flags, header_len, token_count)
    if body_end - payload_at != header.stored_len:
        raise BlockShapeError(f"payload is {body_end - payload_at} bytes, header says {header.stored_len}")
    return header, view[payload_at:body_end]


def decode_block(data: bytes, expected_fingerprint: str | None = None) -> tuple[ChunkKV, BlockHeader]:
    header, payload = read_header(data)
    if expected_fingerprint is not None and header.fingerprint != expected_fingerprint:
        raise BlockFingerprintError(f"block is from model {header.fingerprint[:16]}, expected {expected_fingerprint[:16]}")
    if header.shape[2] != len(header.token_ids):
        raise BlockShapeError(f"shape has {header.shape[2]} tokens, header lists {len(header.token_ids)} token ids")
    try:
        codec = make_codec(header.codec, **header.codec_params)
        expected = codec.payload_size(header.shape)
    except (CodecError, ValueError) as e:
        raise BlockShapeError(f"codec {header.codec!r}: {e}") from None
    if expected != header.raw_len:
        raise BlockShapeError(f"shape {header.shape} needs {expected} payload bytes, header says {header.raw_len}")
    # The decoded floats are at most 16x the codec payload (2 bits -> fp32); bound the payload itself.
    if not header.lz4 and header.raw_len != header.stored_len:
        raise BlockShapeError("uncompressed payload length differs from raw length")
    if header.lz4 and header.raw_len > LZ4_MAX_RATIO * max(header.stored_len, 1):
        raise BlockShapeError(f"lz4 payload of {header.stored_len} bytes cannot expand to {header.raw_len}")
    if math.prod(header.shape) * 2 * 4 > 16 * MAX_RAW_BYTES:
        raise BlockShapeError(f"shape {header.shape} too large")
    try:
        raw = lz4.block.decompress(payload, uncompressed_size=header.raw_len) if header.lz4 else payload
    except lz4.block.LZ4BlockError as e:
        raise BlockShapeError(f"lz4 payload does not decompress: {e}") from None
    if len(raw) != header.raw_len:
        raise BlockShapeError(f"payload decompressed to {len(raw)} bytes, expected {header.raw_len}")
    try:
        keys, values = codec.decode(raw, header.shape, DTYPES[header.dtype])
    except (CodecError, ValueError, RuntimeError) as e:
        raise BlockShapeError(f"payload does not decode: {e}") from None
    if tuple(keys.shape) != header.shape or tuple(values.shape) != header.shape:
        raise BlockShapeError(f"decoded {tuple(keys.shape)}, header says {header.shape}")
    return ChunkKV(keys=keys, values=values, token_ids=list(header.token_ids)), header
