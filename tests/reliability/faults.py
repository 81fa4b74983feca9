"""Fault-injection helpers: a redis-server that persists (so a kill can leave something behind),
block mutations, and consistency checks over what a store holds after a crash."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from kvstore import block
from kvstore.block import decode_block


# -- block mutations: each returns damaged bytes for a valid block -------------------------------

# Block layout (kvstore/block.py, version 2): prefix, JSON header, u32 token ids, payload, checksum.
_PREFIX = struct.Struct("<4sHHII")  # magic, version, flags, header_len, token_count


def _split(data: bytes) -> tuple[int, dict, bytes]:
    """flags, the header as a dict (token ids included, as in `reframe`), and the stored payload."""
    magic, version, flags, n, count = _PREFIX.unpack_from(data)
    header = json.loads(data[_PREFIX.size:_PREFIX.size + n])
    header["token_ids"] = list(struct.unpack_from(f"<{count}I", data, _PREFIX.size + n))
    return flags, header, data[_PREFIX.size + n + 4 * count:-block.CHECKSUM_BYTES]


def reframe(header: dict, payload: bytes, flags: int = 0) -> bytes:
    """A block with a *valid* checksum around `header` (what a foreign writer or an attacker produces).
    `header["token_ids"]` (u32 values) go in the binary token section, the rest in the JSON header."""
    fields = dict(header)
    tokens = fields.pop("token_ids", [])
    raw = json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()
    ids = struct.pack(f"<{len(tokens)}I", *tokens)
    body = _PREFIX.pack(block.MAGIC, block.FORMAT_VERSION, flags, len(raw), len(tokens)) + raw + ids + payload
    return body + block._digest(body)


def flip_byte(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:]


def truncate(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


def wrong_header(data: bytes) -> bytes:
    return b"XXXX" + data[4:]


def foreign_fingerprint(data: bytes) -> bytes:
    flags, header, payload = _split(data)
    return reframe(dict(header, fingerprint="0" * 64), payload, flags)


MUTATIONS = {"flipped": flip_byte, "truncated": truncate, "wrong_header": wrong_header,
             "foreign_fingerprint": foreign_fingerprint}


def engine_fingerprints(engine) -> tuple[str, str]:
    """The fingerprints an engine's blocks carry: its chunk store's (model + chunk form) and its prefix store's."""
    return engine.store.fingerprint, engine.prefix_store.fingerprint


def check_disk_store(root: Path, engine=None) -> dict:
    """Reopen a disk store after a crash: every visible block decodes (with `engine`: under the fingerprint
    of its chunk store or of its prefix store), no temp file is left, and the reopened index (LRU sizes,
    pins) agrees with the files. Returns a summary."""
    from kvstore.backends.disk import BLOCK_SUFFIX, PIN_SUFFIX, DiskBackend

    backend = DiskBackend(root)  # the reopen: clears crashed temp files, rebuilds LRU + pins
    files = {p.name[: -len(BLOCK_SUFFIX)]: p.stat().st_size for p in root.glob(f"*/*{BLOCK_SUFFIX}")}
    pins = {p.name[: -len(PIN_SUFFIX)] for p in root.glob(f"*/*{PIN_SUFFIX}")}
    leftovers = [p.name for p in root.glob("*/*") if not p.name.endswith((BLOCK_SUFFIX, PIN_SUFFIX))]
    assert leftovers == [], f"temp or stray files after reopen: {leftovers}"
    assert set(backend.keys()) == set(files)
    stats = backend.stats()
    assert stats["bytes_used"] == sum(files.values()) and stats["blocks"] == len(files)
    assert backend._lru.pinned == pins & set(files)
    for key in files:
        kv, header = decode_block(backend.get(key))
        assert tuple(kv.keys.shape) == header.shape
        if engine is not None:
            assert header.fingerprint in engine_fingerprints(engine)
    return {"blocks": len(files), "pinned": len(backend._lru.pinned), "bytes": sum(files.values())}
