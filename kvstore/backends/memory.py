"""In-process byte store (`memory:`), and MemoryTier: a byte-budgeted LRU in front of any backend."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from kvstore.backends.base import Backend, LRUIndex, check_key
from kvstore.backends.registry import register_backend
from kvstore.stats import BackendStats


@register_backend("memory")
class MemoryBackend(Backend):
    scheme = "memory"

    def __init__(self, budget_bytes: int | None = None):
        self._data: dict[str, bytes] = {}
        self._lru = LRUIndex(budget_bytes)
        self.hits = self.misses = 0

    @classmethod
    def from_url(cls, url: str, budget_bytes: int | None = None) -> "MemoryBackend":
        return cls(budget_bytes)

    def get(self, key: str) -> bytes | None:
        with self._lru.lock:
            data = self._data.get(key)
            if data is None:
                self.misses += 1
                return None
            self.hits += 1
            self._lru.touch(key)
            return data

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        data = bytes(data)
        with self._lru.lock:
            for victim in self._lru.victims_for(key, len(data)):
                self._drop(victim)
                self._lru.evictions += 1
            self._data[key] = data
            pinned = key in self._lru.pinned
            self._lru.add(key, len(data))
            if pinned:
                self._lru.pinned.add(key)

    def _drop(self, key: str) -> bool:
        self._data.pop(key, None)
        return self._lru.remove(key) is not None

    def delete(self, key: str) -> bool:
        with self._lru.lock:
            return self._drop(key)

    def contains(self, key: str) -> bool:
        return key in self._data

    def pin(self, key: str) -> bool:
        with self._lru.lock:
            if key not in self._data:
                return False
            self._lru.pinned.add(key)
            return True

    def unpin(self, key: str) -> bool:
        with self._lru.lock:
            was = key in self._lru.pinned
            self._lru.pinned.discard(key)
            return was

    def keys(self) -> Iterator[str]:
        with self._lru.lock:
            return iter(list(self._data))

    def stats(self) -> dict:
        return BackendStats("memory", **self._lru.counts(), hits=self.hits, misses=self.misses)

    def __repr__(self) -> str:
        return f"MemoryBackend(budget_bytes={self._lru.budget})"


class MemoryTier(Backend):
    """Read-through, write-through in-memory LRU over `inner`.

    The tier is a cache: it evicts freely (pins are the inner store's business),
    never holds more than `budget_bytes`, and skips blocks larger than its budget.
    """

    def __init__(self, inner: Backend, budget_bytes: int):
        self.inner = inner
        self.cache = MemoryBackend(budget_bytes)
        self.budget = budget_bytes

    def get(self, key: str) -> bytes | None:
        data = self.cache.get(key)
        if data is not None:
            return data
        data = self.inner.get(key)
        if data is not None:
            self._fill(key, data)
        return data

    def get_many(self, keys) -> list[bytes | None]:
        keys = list(keys)
        out = [self.cache.get(k) for k in keys]
        missing = [i for i, d in enumerate(out) if d is None]
        if missing:
            for i, data in zip(missing, self.inner.get_many([keys[i] for i in missing])):
                out[i] = data
                if data is not None:
                    self._fill(keys[i], data)
        return out

    def _fill(self, key: str, data: bytes) -> None:
        if len(data) <= self.budget:
            self.cache.put(key, data)  # never raises StoreFullError: nothing in the cache is pinned

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)  # the store of record first: a failed put leaves no cached copy
        if len(data) <= self.budget:
            self.cache.put(key, data)
        else:
            self.cache.delete(key)

    def put_many(self, items) -> None:
        items = list(items)
        self.inner.put_many(items)
        for key, data in items:
            self._fill(key, data)

    def delete(self, key: str) -> bool:
        self.cache.delete(key)
        return self.inner.delete(key)

    def contains(self, key: str) -> bool:
        return self.cache.contains(key) or self.inner.contains(key)

    def pin(self, key: str) -> bool:
        return self.inner.pin(key)

    def unpin(self, key: str) -> bool:
        return self.inner.unpin(key)

    def keys(self) -> Iterator[str]:
        return self.inner.keys()

    def stats(self) -> dict:
        return replace(self.inner.stats(), tier=self.cache.stats())

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"MemoryTier({self.inner!r}, budget_bytes={self.budget})"
