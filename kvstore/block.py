"""Block framing: one chunk's encoded KV as a self-describing, checksummed byte string.

Layout (integers little-endian):

    0   magic          4 bytes  b"RKVB"
    4   version        u16      FORMAT_VERSION
    6   flags          u16      bit 0: payload is lz4-compressed (lz4 block format)
                                bit 1: a compressed chunk (positions section, header "compression")
    8   header_len     u32      <= MAX_HEADER_BYTES
    12  token_count    u32      <= MAX_TOKENS
    16  header         header_len bytes of UTF-8 JSON (see BlockHeader; token ids are not in it)
    ..  token_ids      token_count u32s, each <= MAX_TOKEN_ID
    ..  payload        header["stored_len"] bytes
    ..  positions      (bit 1 only) layers * kv_heads * slots u32s: the position in the chunk of each
                       kept slot, per layer and head; PAD_POSITION marks padding (heads keep unequal counts)
    -16 checksum       xxh3-128 over every byte before it (prefix + header + token ids + payload)

Token ids are binary, not JSON: a hit parses them with one array copy and
checks them with builtin min/max, where a JSON list of 256 ids cost more than
the checksum (version 1 kept them in the JSON header; it is no longer read).

Version 3 adds pre-RoPE keys (KVQuant): a codec with `pre_rope` stores the keys
before rotary embedding, so its per-channel quantization sees the un-rotated
channel structure, and the header carries the RoPE frequencies ("inv_freq",
[head_dim/2] floats) the keys were un-rotated with. Such a block decodes to a
ChunkKV with `pre_rope=True`, whose keys are rotated once, at their target
positions, when they are placed (ChunkKV.keys_at, workers.blend.fuse_chunks).
Version 2 blocks (no such field) are refused as BlockVersionError: a miss.

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
from kvstore.codecs.base import to_bytes
from kvstore.kernels.transfer import to_host
from kvstore.kv import ChunkKV

MAGIC = b"RKVB"
FORMAT_VERSION = 3
FLAG_LZ4 = 1
FLAG_POSITIONS = 2
PAD_POSITION = 0xFFFFFFFF
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
    inv_freq: tuple[float, ...] | None = None  # pre-RoPE blocks: the keys' RoPE frequencies [head_dim/2]
    compression: dict | None = None  # compressed chunks: the spec they were compressed with (FLAG_POSITIONS)

    def to_json(self) -> bytes:
        """The JSON header section (everything but the token ids, which follow it in binary)."""
        fields = {
            "codec": self.codec, "codec_params": self.codec_params, "shape": list(self.shape),
            "dtype": self.dtype, "fingerprint": self.fingerprint,
            "raw_len": self.raw_len, "stored_len": self.stored_len, "inv_freq": self.inv_freq,
        }
        if self.compression is not None:
            fields["compression"] = self.compression
        return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()

    @property
    def positions_len(self) -> int:
        """Bytes of the positions section (compressed chunks), 0 otherwise."""
        return 0 if self.compression is None else math.prod(self.shape[:3]) * TOKEN_BYTES


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
    """Three steps: keys into the codec's form (pre-RoPE or not), quantize on the KV's device
    (Triton kernels on CUDA), copy the packed parts to the host (one pinned buffer), frame."""
    if kv.keys.dtype not in DTYPE_NAMES:
        raise ValueError(f"unsupported KV dtype {kv.keys.dtype}")
    kv = kv.with_rope(codec.pre_rope)
    parts = codec.encode_parts(kv.keys, kv.values)  # on kv's device
    raw = to_bytes(*to_host(parts))  # the only device -> host copy
    return frame_block(kv, codec, fingerprint, raw)


def frame_block(kv: ChunkKV, codec: Codec, fingerprint: str, raw: bytes) -> bytes:
    """Header + token ids + payload (lz4 when it pays) + checksum, around a codec payload."""
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
        inv_freq=tuple(float(f) for f in kv.inv_freq.float().cpu().flatten()) if kv.pre_rope else None,
        compression=kv.compression if kv.positions is not None else None,
    ).to_json()
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"block header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    positions = b""
    if kv.positions is not None:
        flags |= FLAG_POSITIONS
        packed_positions = array(_U32, kv.positions.masked_fill(~kv.head_mask, PAD_POSITION).reshape(-1).tolist())
        if _SWAP:
            packed_positions.byteswap()
        positions = packed_positions.tobytes()
    body = b"".join((_PREFIX.pack(MAGIC, FORMAT_VERSION, flags, len(header), len(token_ids)), header, tokens, stored,
                     positions))
    return body + _digest(body)


def verified_checksum(data: bytes) -> bytes | None:
    """The block's trailing checksum if it matches the bytes before it, else None (too short, damaged).
    Only the checksum: a decoded copy of these very bytes is still what decode_block would give."""
    view = memoryview(data)
    if len(view) < _PREFIX.size + CHECKSUM_BYTES:
        return None
    checksum = bytes(view[-CHECKSUM_BYTES:])
    return checksum if _digest(view[:-CHECKSUM_BYTES]) == checksum else None


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
        inv_freq = _inv_freq(h.get("inv_freq"), shape[0], shape[3])  # absent = null
        return BlockHeader(
            version=version, codec=h["codec"], codec_params=h["codec_params"], shape=shape, dtype=h["dtype"],
            fingerprint=h["fingerprint"], token_ids=ids.tolist(), lz4=bool(flags & FLAG_LZ4),
            raw_len=_int(h["raw_len"], "raw_len", 0, MAX_RAW_BYTES),
            stored_len=_int(h["stored_len"], "stored_len", 0, MAX_RAW_BYTES), inv_freq=inv_freq,
            compression=_compression(h.get("compression"), flags),
        )
    except KeyError as e:
        raise BlockFormatError(f"header lacks field {e}") from None
    except TypeError as e:  # e.g. an unhashable dtype
        raise BlockFormatError(f"header field of the wrong type: {e}") from None


def _compression(value, flags: int) -> dict | None:
    """A JSON object exactly when FLAG_POSITIONS is set."""
    if bool(flags & FLAG_POSITIONS) != (value is not None) or (value is not None and not isinstance(value, dict)):
        raise BlockFormatError("a positions section and a compression object come together")
    return value


def _inv_freq(value, layers: int, head_dim: int) -> tuple[float, ...] | None:
    """null, or head_dim/2 finite floats (every layer alike), or layers x head_dim/2 (per layer, Gemma 3)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) not in (head_dim // 2, layers * head_dim // 2) or \
            not all(isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) for f in value):
        raise BlockFormatError(f"inv_freq must be null or {head_dim // 2} (or {layers} x {head_dim // 2}) finite numbers")
    return tuple(float(f) for f in value)


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
    if flags & ~(FLAG_LZ4 | FLAG_POSITIONS):
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
    if body_end - payload_at != header.stored_len + header.positions_len:
        raise BlockShapeError(f"payload is {body_end - payload_at} bytes, header says "
                              f"{header.stored_len} + {header.positions_len} of positions")
    return header, view[payload_at:payload_at + header.stored_len]


def _positions(data: bytes, header: BlockHeader) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions section (the bytes before the checksum) -> positions, head_mask [layers, kv_heads, slots]."""
    end = len(data) - CHECKSUM_BYTES
    values = array(_U32)
    values.frombytes(memoryview(data)[end - header.positions_len:end])
    if _SWAP:
        values.byteswap()
    positions = torch.tensor(values.tolist(), dtype=torch.int64).reshape(header.shape[:3])
    head_mask = positions != PAD_POSITION
    if bool((positions[head_mask] >= len(header.token_ids)).any()):
        raise BlockShapeError("a kept position lies outside the chunk")
    return positions.masked_fill(~head_mask, 0), head_mask


def decode_block(data: bytes, expected_fingerprint: str | None = None,
                 device: torch.device | str | None = None) -> tuple[ChunkKV, BlockHeader]:
    """Verified block -> (KV, header); KV on `device` (default CPU): the payload is copied there once
    and dequantized there (Triton on CUDA). A pre-RoPE block gives a ChunkKV with pre_rope=True."""
    header, payload = read_header(data)
    if expected_fingerprint is not None and header.fingerprint != expected_fingerprint:
        raise BlockFingerprintError(f"block is from model {_short(header.fingerprint)}, "
                                    f"expected {_short(expected_fingerprint)}")
    if header.shape[2] != len(header.token_ids) and not (header.compression is not None
                                                         and header.shape[2] <= len(header.token_ids)):
        raise BlockShapeError(f"shape has {header.shape[2]} tokens, header lists {len(header.token_ids)} token ids")
    try:
        codec = make_codec(header.codec, **header.codec_params)
        expected = codec.payload_size(header.shape)
    except (CodecError, ValueError) as e:
        raise BlockShapeError(f"codec {header.codec!r}: {e}") from None
    if expected != header.raw_len:
        raise BlockShapeError(f"shape {header.shape} needs {expected} payload bytes, header says {header.raw_len}")
    if codec.pre_rope != (header.inv_freq is not None):
        raise BlockShapeError(f"codec {header.codec!r} pre_rope={codec.pre_rope} but the header "
                              f"{'lacks' if codec.pre_rope else 'has'} inv_freq")
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
        keys, values = codec.decode(raw, header.shape, DTYPES[header.dtype], device)
    except (CodecError, ValueError, RuntimeError) as e:
        raise BlockShapeError(f"payload does not decode: {e}") from None
    if tuple(keys.shape) != header.shape or tuple(values.shape) != header.shape:
        raise BlockShapeError(f"decoded {tuple(keys.shape)}, header says {header.shape}")
    inv_freq = None if header.inv_freq is None else torch.tensor(header.inv_freq, dtype=torch.float32)
    if inv_freq is not None and inv_freq.numel() != header.shape[3] // 2:  # per layer: [L, 1, 1, D/2]
        inv_freq = inv_freq.reshape(header.shape[0], 1, 1, -1)
    positions, head_mask = _positions(data, header) if header.compression is not None else (None, None)
    try:
        return ChunkKV(keys=keys, values=values, token_ids=list(header.token_ids), inv_freq=inv_freq,
                       pre_rope=codec.pre_rope, positions=positions, head_mask=head_mask,
                       compression=header.compression), header
    except ValueError as e:
        raise BlockShapeError(str(e)) from None


def decode_blocks(datas: list[bytes], expected_fingerprint: str | None = None,
                  device: torch.device | str | None = None) -> list[ChunkKV | BlockError]:
    """decode_block over one request's blocks: per block its KV, or the BlockError that refused it."""
    out: list[ChunkKV | BlockError] = []
    for data in datas:
        try:
            out.append(decode_block(data, expected_fingerprint, device)[0])
        except BlockError as e:
            out.append(e)
    return out


def _short(fingerprint: str) -> str:
    """A fingerprint for messages: the model hash's first 16 digits, and any qualifier after the hash
    (a chunk form, workers/chunk_forms.py)."""
    return fingerprint[:16] + fingerprint[64:]
