"""Typed statistics of the storage layer: one backend (BackendStats) and one BlockStore (StoreStats).

Dataclasses, as StoreCounters is. `as_dict()` is the JSON the Stats RPC carries (its keys are the
public contract, unchanged); so that readers of the old dicts keep working, every stats object is
also a read-only Mapping over that JSON (`stats["bytes_used"]` is `stats.bytes_used`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields


@dataclass
class StoreCounters:
    """A BlockStore's running counts (kvstore/store.py); their names are keys of the Stats JSON."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    corrupt: int = 0  # blocks that failed checksum/format/shape checks (deleted)
    foreign: int = 0  # blocks from another model fingerprint (deleted)
    token_mismatch: int = 0  # a hit whose token ids differ from the caller's (treated as a miss)
    unavailable: int = 0  # operations that found the backend down
    bytes_read: int = 0
    bytes_written: int = 0


class StatsView(Mapping):
    """Read-only mapping over `as_dict()`; subclasses are dataclasses and define as_dict."""

    def as_dict(self) -> dict:
        raise NotImplementedError

    def __getitem__(self, key: str):
        return self.as_dict()[key]

    def __iter__(self):
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


TIER_KEYS = ("bytes_used", "budget_bytes", "blocks", "evictions", "hits", "misses")  # an in-memory tier's JSON


@dataclass(frozen=True, eq=False)
class BackendStats(StatsView):
    backend: str  # the backend's name (metrics label): disk, memory, redis, ...
    bytes_used: int = 0
    budget_bytes: int | None = None
    blocks: int = 0
    pinned: int = 0
    evictions: int = 0  # blocks evicted to stay within the budget
    hits: int = 0
    misses: int = 0
    tier: BackendStats | None = None  # the in-memory tier in front of this backend (MemoryTier), if any

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "tier"}
        if self.tier is not None:
            out["tier"] = {k: getattr(self.tier, k) for k in TIER_KEYS}
        return out

    def backends(self) -> list[tuple[str, BackendStats]]:
        """(metrics label, stats) for this backend and its tier: the tier is labelled memory_tier."""
        return [(self.backend, self)] + ([("memory_tier", self.tier)] if self.tier is not None else [])


@dataclass(frozen=True, eq=False)
class DecodedStats(StatsView):
    """The decoded-KV tier in front of a store's blocks (kvstore/decoded.py): hits there skip a decode."""

    bytes_used: int = 0
    budget_bytes: int = 0  # 0: the tier is off
    blocks: int = 0
    evictions: int = 0  # decoded chunks dropped to stay within the budget
    hits: int = 0
    misses: int = 0

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, eq=False)
class StoreStats(StatsView):
    codec: dict  # the codec's spec
    fingerprint: str
    degraded: bool
    counters: StoreCounters
    backend: BackendStats | None  # None: the backend could not be reached for its figures
    decoded: DecodedStats = field(default_factory=DecodedStats)  # the decoded-KV tier (budget 0 when off)

    def as_dict(self) -> dict:
        backend = {} if self.backend is None else self.backend.as_dict()
        return {"codec": self.codec, "fingerprint": self.fingerprint, "degraded": self.degraded,
                **asdict(self.counters), "backend": backend, "decoded": self.decoded.as_dict()}
