"""DecodedTier: a byte-budgeted LRU of decoded chunk KV, in front of the compressed blocks.

RAG traffic repeats its popular chunks, and a block's decode (lz4, dequantize, un-rotate) costs far
more than reading its bytes. BlockStore (kvstore/store.py) keeps each decoded ChunkKV here, by block
address, in the dtype and on the device decode_block gave it, so a repeated chunk costs a check of its
block instead of a decode.

A hit is served only while the store still holds the very block it was decoded from: an entry keeps
the block's checksum (its last CHECKSUM_BYTES), and BlockStore.get serves the entry only after reading
the block's current bytes and verifying that checksum over them (xxh3, tens of GB/s). So a block that
was deleted, dropped by a budget, replaced or damaged since is a miss here and goes through
decode_block's checks again: the tier never changes what a read returns, only what it costs.

The KV handed out is shared with the tier: callers must treat a ChunkKV from BlockStore.get as
read-only (fuse_chunks and place_chunk copy it into the request's own cache; anything that would
modify it in place must clone it first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from kvstore.kv import ChunkKV


def kv_bytes(kv: ChunkKV) -> int:
    """Bytes a decoded chunk holds (keys, values and a compressed chunk's positions and mask)."""
    extra = [t for t in (kv.positions, kv.head_mask, kv.inv_freq) if t is not None]
    return kv.keys.nbytes + kv.values.nbytes + sum(t.nbytes for t in extra)


@dataclass
class _Entry:
    kv: ChunkKV
    checksum: bytes  # the block's trailing checksum: the entry stands for exactly those bytes
    size: int


class DecodedTier:
    """LRU of decoded chunks by address under `budget_bytes` (0 = off: nothing kept, every get a miss).

    Thread-safe. `hits`/`misses` count lookups, `evictions` the entries dropped to stay in budget; a
    chunk larger than the whole budget is not kept."""

    def __init__(self, budget_bytes: int = 0):
        if not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"decoded tier budget must be an int >= 0, got {budget_bytes!r}")
        self.budget = budget_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.used = self.hits = self.misses = self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __contains__(self, address: str) -> bool:
        return address in self._entries

    def get(self, address: str, checksum: bytes | None) -> ChunkKV | None:
        """The KV decoded from the block at `address` whose checksum is `checksum`, or None (a miss, counted;
        an entry for other bytes, or for bytes that no longer verify (None), is dropped)."""
        with self._lock:
            entry = self._entries.get(address)
            if entry is None or entry.checksum != checksum:
                if entry is not None:  # the block there changed: this entry stands for nothing now
                    self._drop(address)
                self.misses += 1
                return None
            self._entries.move_to_end(address)
            self.hits += 1
            return entry.kv

    def put(self, address: str, checksum: bytes, kv: ChunkKV) -> None:
        """Keep `kv`, decoded from the block at `address` (trailing checksum `checksum`), evicting the least
        recently used entries to fit."""
        size = kv_bytes(kv)
        with self._lock:
            self._drop(address)
            if size > self.budget:
                return
            while self.used + size > self.budget:
                self._drop(next(iter(self._entries)))
                self.evictions += 1
            self._entries[address] = _Entry(kv, bytes(checksum), size)
            self.used += size

    def discard(self, address: str) -> None:
        """Forget `address` (the block was deleted or rewritten through the store)."""
        with self._lock:
            self._drop(address)

    def _drop(self, address: str) -> None:
        entry = self._entries.pop(address, None)
        if entry is not None:
            self.used -= entry.size

    def counts(self) -> dict:
        """The tier's figures, as DecodedStats fields."""
        with self._lock:
            return {"bytes_used": self.used, "budget_bytes": self.budget, "blocks": len(self._entries),
                    "evictions": self.evictions, "hits": self.hits, "misses": self.misses}
