"""Content address of a chunk's stored KV: a hash of everything that changes the bytes.

sha256 over a canonical, length-prefixed byte encoding of
(model fingerprint, namespace, codec spec with defaults filled in, token ids),
so it is the same in every process and on every machine (never Python's hash()).
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Sequence

from kvstore.codecs import Codec, codec_from_spec

_DOMAIN = b"ragkv/chunk/v1"


def _field(h: "hashlib._Hash", data: bytes) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def canonical_codec_spec(codec_spec: "str | dict | Codec") -> bytes:
    """'kivi2' and {'name': 'kivi2', 'params': {'group_size': 32, 'residual': 0}} encode the same."""
    spec = codec_from_spec(codec_spec).spec()
    return json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()


def chunk_address(fingerprint: str, token_ids: Sequence[int], codec_spec: "str | dict | Codec",
                  namespace: str = "") -> str:
    h = hashlib.sha256()
    _field(h, _DOMAIN)
    _field(h, fingerprint.encode())
    _field(h, namespace.encode())
    _field(h, canonical_codec_spec(codec_spec))
    ids = [int(t) for t in token_ids]
    if any(t < 0 or t >= 1 << 63 for t in ids):
        raise ValueError("token ids must be non-negative 64-bit integers")
    _field(h, struct.pack(f"<{len(ids)}Q", *ids))
    return h.hexdigest()
