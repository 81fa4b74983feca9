"""Backend: a byte store of blocks by key, with a byte budget, LRU eviction and pins.

The backends know nothing about KV: they move opaque bytes. Eviction is
least-recently-used by byte budget and never touches a pinned key; if a put
cannot fit without evicting pinned blocks it raises StoreFullError.
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Iterable, Iterator

from kvstore.stats import BackendStats

_KEY_RE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,199}$")


class BackendError(Exception):
    """Base class for storage-layer errors."""


class BackendUnavailable(BackendError):
    """The store cannot be reached (network down, disk error). Callers treat it as a miss."""


class StoreFullError(BackendError):
    """A put does not fit in the budget even after evicting every unpinned block."""


def check_key(key: str) -> str:
    """Keys become file names and redis keys: a short, safe alphabet (hex addresses fit)."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"invalid block key {key!r}")
    return key


class Backend(ABC):
    scheme: str = ""

    @abstractmethod
    def get(self, key: str) -> bytes | None: ...

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def delete(self, key: str) -> bool: ...

    @abstractmethod
    def contains(self, key: str) -> bool: ...

    @abstractmethod
    def pin(self, key: str) -> bool:
        """Protect a stored key from eviction; False if it is not stored."""

    @abstractmethod
    def unpin(self, key: str) -> bool: ...

    @abstractmethod
    def keys(self) -> Iterator[str]: ...

    @abstractmethod
    def stats(self) -> BackendStats: ...

    def close(self) -> None:
        pass

    def get_many(self, keys: Iterable[str]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> None:
        for key, data in items:
            self.put(key, data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LRUIndex:
    """In-memory LRU bookkeeping (key -> size, oldest first) with pins. Thread-safe via `lock`."""

    def __init__(self, budget_bytes: int | None):
        if budget_bytes is not None and budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0 or None")
        self.budget = budget_bytes
        self.sizes: OrderedDict[str, int] = OrderedDict()
        self.pinned: set[str] = set()
        self.used = 0
        self.evictions = 0
        self.lock = threading.RLock()

    def __contains__(self, key: str) -> bool:
        return key in self.sizes

    def touch(self, key: str) -> None:
        if key in self.sizes:
            self.sizes.move_to_end(key)

    def add(self, key: str, size: int) -> None:
        self.remove(key)
        self.sizes[key] = size
        self.used += size

    def remove(self, key: str) -> int | None:
        size = self.sizes.pop(key, None)
        if size is not None:
            self.used -= size
        self.pinned.discard(key)
        return size

    def victims_for(self, key: str, size: int) -> list[str]:
        """Oldest unpinned keys to drop so `key` (size bytes) fits. Raises StoreFullError."""
        if self.budget is None:
            return []
        over = self.used - self.sizes.get(key, 0) + size - self.budget
        victims: list[str] = []
        for k, s in self.sizes.items():  # oldest first
            if over <= 0:
                break
            if k == key or k in self.pinned:
                continue
            victims.append(k)
            over -= s
        if over > 0:
            raise StoreFullError(
                f"block {key[:16]} of {size} bytes does not fit: budget {self.budget}, "
                f"{self.used} bytes used, {len(self.pinned)} pinned blocks")
        return victims

    def counts(self) -> dict:
        """The LRU's figures, as BackendStats fields."""
        return {"bytes_used": self.used, "budget_bytes": self.budget, "blocks": len(self.sizes),
                "pinned": len(self.pinned), "evictions": self.evictions}
