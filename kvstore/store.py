"""BlockStore: codec + block framing + backend, behind content addresses.

A store read never fails loudly: a corrupt, truncated, foreign or
wrong-version block is counted, deleted and reported as a miss, and an
unreachable backend is a miss that marks the store `degraded`, so callers
simply recompute. The only error a put surfaces is StoreFullError (pinned
blocks fill the budget); an unreachable backend on put returns False.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import Sequence

from kvstore.address import chunk_address
from kvstore.backends.base import Backend, BackendUnavailable
from kvstore.block import BlockError, BlockFingerprintError, BlockHeader, decode_block, encode_block, read_header
from kvstore.codecs import Codec, codec_from_spec
from kvstore.kv import ChunkKV
from kvstore.stats import StoreStats

log = logging.getLogger(__name__)


@dataclass
class StoreCounters:
    hits: int = 0
    misses: int = 0
    puts: int = 0
    corrupt: int = 0  # blocks that failed checksum/format/shape checks (deleted)
    foreign: int = 0  # blocks from another model fingerprint (deleted)
    token_mismatch: int = 0  # a hit whose token ids differ from the caller's (treated as a miss)
    unavailable: int = 0  # operations that found the backend down
    bytes_read: int = 0
    bytes_written: int = 0


class BlockStore:
    def __init__(self, backend: Backend, codec: "Codec | str | dict", fingerprint: str, device=None):
        """`device`: where decoded KV lands (default CPU); a block's payload is copied there once and
        dequantized there (Triton kernels on CUDA, kvstore/kernels/dispatch.py)."""
        self.backend = backend
        self.codec = codec_from_spec(codec)
        self.fingerprint = fingerprint
        self.device = device
        self.counters = StoreCounters()
        self.degraded = False
        self._lock = threading.Lock()

    def address_for(self, token_ids: Sequence[int], namespace: str = "") -> str:
        return chunk_address(self.fingerprint, token_ids, self.codec, namespace)

    def _count(self, **inc: int) -> None:
        with self._lock:
            for name, n in inc.items():
                setattr(self.counters, name, getattr(self.counters, name) + n)

    def _down(self, e: BackendUnavailable) -> None:
        self.degraded = True
        self._count(unavailable=1)
        log.warning("block store degraded: %s", e)

    # -- writes ---------------------------------------------------------------
    def encode(self, kv: ChunkKV) -> bytes:
        """Block bytes: keys into the codec's RoPE form, quantized on kv's device, the packed parts
        copied to the host through one pinned buffer, framed (kvstore/block.py:encode_block)."""
        return encode_block(kv, self.codec, self.fingerprint)

    def as_stored(self, kv: ChunkKV) -> tuple[bytes, ChunkKV]:
        """The block bytes for `kv` and the KV exactly as a later hit on them will decode.

        Serving a freshly computed chunk from its decoded block (not from the raw tensors)
        makes an answer independent of whether the chunk was cached, so a miss, a hit and a
        recompute after a store fault all give the same tokens.
        """
        data = self.encode(kv)
        decoded, _ = decode_block(data, expected_fingerprint=self.fingerprint, device=self.device)
        return data, decoded

    def put(self, kv: ChunkKV, address: str) -> bool:
        """Store one chunk's KV; False if the backend is down. StoreFullError propagates."""
        return self.put_raw(address, self.encode(kv))

    def put_raw(self, address: str, data: bytes) -> bool:
        try:
            self.backend.put(address, data)
        except BackendUnavailable as e:
            self._down(e)
            return False
        self.degraded = False
        self._count(puts=1, bytes_written=len(data))
        return True

    # -- reads ----------------------------------------------------------------
    def get_raw(self, address: str) -> bytes | None:
        try:
            data = self.backend.get(address)
        except BackendUnavailable as e:
            self._down(e)
            return None
        self.degraded = False
        return data

    def get(self, address: str, token_ids: Sequence[int] | None = None) -> ChunkKV | None:
        """The chunk's KV, or None (absent, damaged, foreign, store down). `token_ids` re-checks a hit."""
        return self._decode(address, self.get_raw(address), token_ids)

    def get_many(self, addresses: Sequence[str]) -> list[ChunkKV | None]:
        try:
            datas = self.backend.get_many(addresses)
        except BackendUnavailable as e:
            self._down(e)
            return [None] * len(addresses)
        self.degraded = False
        return [self._decode(a, d, None) for a, d in zip(addresses, datas)]

    def _decode(self, address: str, data: bytes | None, token_ids: Sequence[int] | None) -> ChunkKV | None:
        if data is None:
            self._count(misses=1)
            return None
        try:
            kv, _ = decode_block(data, expected_fingerprint=self.fingerprint, device=self.device)
        except BlockError as e:
            self._reject(address, e)
            return None
        if token_ids is not None and list(token_ids) != kv.token_ids:
            self._count(token_mismatch=1, misses=1)
            return None
        self._count(hits=1, bytes_read=len(data))
        return kv

    def get_header(self, address: str) -> BlockHeader | None:
        data = self.get_raw(address)
        if data is None:
            return None
        try:
            header, _ = read_header(data)
        except BlockError as e:
            self._reject(address, e)
            return None
        return header

    def _reject(self, address: str, e: BlockError) -> None:
        self._count(misses=1, **({"foreign": 1} if isinstance(e, BlockFingerprintError) else {"corrupt": 1}))
        log.warning("dropping block %s: %s: %s", address[:16], type(e).__name__, e)
        try:
            self.backend.delete(address)
        except BackendUnavailable as down:
            self._down(down)

    # -- management -------------------------------------------------------------
    def contains(self, address: str) -> bool:
        try:
            return self.backend.contains(address)
        except BackendUnavailable as e:
            self._down(e)
            return False

    def pin(self, address: str) -> bool:
        return self._manage(self.backend.pin, address)

    def unpin(self, address: str) -> bool:
        return self._manage(self.backend.unpin, address)

    def delete(self, address: str) -> bool:
        """Delete a block (what the Evict RPC does; dropping tokens from a KV cache is workers/eviction)."""
        return self._manage(self.backend.delete, address)

    def _manage(self, op, address: str) -> bool:
        """pin/unpin/delete; an unreachable backend is False (nothing done) and marks the store degraded."""
        try:
            return op(address)
        except BackendUnavailable as e:
            self._down(e)
            return False

    def stats(self) -> StoreStats:
        try:
            backend = self.backend.stats()
        except BackendUnavailable as e:
            self._down(e)
            backend = None
        with self._lock:
            counters = replace(self.counters)  # a snapshot
        return StoreStats(self.codec.spec(), self.fingerprint, self.degraded, counters, backend)

    def close(self) -> None:
        self.backend.close()
