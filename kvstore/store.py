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
from dataclasses import replace
from typing import Sequence

from kvstore.address import chunk_address
from kvstore.backends.base import Backend, BackendUnavailable
from kvstore.block import (CHECKSUM_BYTES, BlockError, BlockFingerprintError, BlockHeader, decode_block, decode_blocks,
                           encode_block, read_header, verified_checksum)
from kvstore.codecs import Codec, codec_from_spec
from kvstore.decoded import DecodedTier
from kvstore.kv import ChunkKV
from kvstore.stats import DecodedStats, StoreCounters, StoreStats  # noqa: F401 (StoreCounters: its old home)

log = logging.getLogger(__name__)


class BlockStore:
    def __init__(self, backend: Backend, codec: "Codec | str | dict", fingerprint: str, device=None,
                 decoded_budget_bytes: int = 0):
        """`device`: where decoded KV lands (default CPU); a block's payload is copied there once and
        dequantized there (Triton kernels on CUDA, kvstore/kernels/dispatch.py). `decoded_budget_bytes`:
        the decoded-KV tier in front of the blocks (kvstore/decoded.py); 0 = off."""
        self.backend = backend
        self.codec = codec_from_spec(codec)
        self.fingerprint = fingerprint
        self.device = device
        self.decoded = DecodedTier(decoded_budget_bytes)
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
        self.decoded.discard(address)
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
        """The chunk's KV, or None (absent, damaged, foreign, store down). `token_ids` re-checks a hit.

        The KV may be shared with the decoded tier (kvstore/decoded.py): read it, never modify it in place."""
        return self._read(address, self.get_raw(address), token_ids)

    def get_many(self, addresses: Sequence[str],
                 token_ids: Sequence[Sequence[int] | None] | None = None) -> list[ChunkKV | None]:
        """get() for one request's chunks: their bytes in one backend call (one round trip on Redis), the
        decoded tier's hits served from there, the cold blocks decoded together (decode_blocks).
        `token_ids[i]` (or None) re-checks hit i. The KV is read-only, as get()'s."""
        token_ids = list(token_ids) if token_ids is not None else [None] * len(addresses)
        if len(token_ids) != len(addresses):
            raise ValueError(f"{len(addresses)} addresses but {len(token_ids)} token id lists")
        try:
            datas = self.backend.get_many(addresses)
        except BackendUnavailable as e:
            self._down(e)
            return [None] * len(addresses)
        self.degraded = False
        out = [self._from_tier(a, d) for a, d in zip(addresses, datas)]
        cold = [i for i, (kv, d) in enumerate(zip(out, datas)) if kv is None and d is not None]
        decoded = decode_blocks([datas[i] for i in cold], expected_fingerprint=self.fingerprint, device=self.device)
        for i, kv in zip(cold, decoded):
            out[i] = self._decoded(addresses[i], datas[i], kv)
        # a refused block (decoded, then None) was counted as it was dropped
        return [None if kv is None and i in cold else self._checked(kv, d, ids)
                for i, (kv, d, ids) in enumerate(zip(out, datas, token_ids))]

    def _read(self, address: str, data: bytes | None, token_ids: Sequence[int] | None) -> ChunkKV | None:
        kv = self._from_tier(address, data)
        if kv is None and data is not None:
            kv = self._decoded(address, data, decode_blocks([data], self.fingerprint, self.device)[0])
            if kv is None:  # refused: counted and dropped
                return None
        return self._checked(kv, data, token_ids)

    def _from_tier(self, address: str, data: bytes | None) -> ChunkKV | None:
        """The decoded tier's KV for exactly these block bytes (their checksum verified), else None."""
        if data is None or not self.decoded.enabled:
            self.decoded.discard(address)  # the block is gone: so is its decoded copy
            return None
        # a damaged block verifies to None: a miss that drops the entry, then decode_block refuses the block
        checksum = verified_checksum(data) if address in self.decoded else None
        return self.decoded.get(address, checksum)

    def _decoded(self, address: str, data: bytes, kv: "ChunkKV | BlockError") -> ChunkKV | None:
        """A fresh decode's outcome: a rejected block is counted, dropped and None; KV enters the tier."""
        if isinstance(kv, BlockError):
            self._reject(address, kv)
            return None
        if self.decoded.enabled:
            self.decoded.put(address, bytes(memoryview(data)[-CHECKSUM_BYTES:]), kv)
        return kv

    def _checked(self, kv: ChunkKV | None, data: bytes | None, token_ids: Sequence[int] | None) -> ChunkKV | None:
        """Count the read: absent, a token mismatch (a miss) or a hit."""
        if kv is None:
            self._count(misses=1)
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
        self.decoded.discard(address)
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
        self.decoded.discard(address)
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
        return StoreStats(self.codec.spec(), self.fingerprint, self.degraded, counters, backend,
                          DecodedStats(**self.decoded.counts()))

    def close(self) -> None:
        self.backend.close()
