"""Typed engine statistics: what `stats()` of every EngineProtocol implementation returns.

EngineStats is a dataclass; `as_dict()` is the JSON of the Stats RPC (`engine_json`, keys unchanged:
engine, store, model, codec, and workers for RayEngine / worker for one Ray actor). Like the store's
stats (kvstore/stats.py) it is also a read-only Mapping over that JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from kvstore.stats import StatsView, StoreStats
from workers.sequences import SequenceCounters


@dataclass
class EngineCounters:
    requests: int = 0
    chunks_hit: int = 0
    chunks_computed: int = 0
    ingested: int = 0  # chunks computed and stored by ingest
    degraded: int = 0  # requests answered while the store was unreachable

    def __add__(self, other: EngineCounters) -> EngineCounters:
        """Field by field: RayEngine adds up its actors' counters."""
        return EngineCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


@dataclass
class BatchStats:
    """The scheduler's figures (workers/batching/scheduler.py): totals, and the last decode step."""

    steps: int = 0
    decode_steps: int = 0
    prefills: int = 0
    tokens: int = 0  # tokens decoded by batched steps
    batch_size: int = 0  # requests in the last decode step
    step_s: float = 0.0  # duration of the last decode step
    waiting: int = 0  # requests queued for a place in the batch
    running: int = 0  # requests in the batch
    background_done: int = 0  # idle-time jobs (exact sequence prefills, shadow checks) finished
    background_dropped: int = 0  # not queued: the background queue was full
    background_failed: int = 0

    def __add__(self, other: BatchStats) -> BatchStats:
        """RayEngine: the actors' figures added up (the slowest last step)."""
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        return BatchStats(**{**summed, "step_s": max(self.step_s, other.step_s)})


@dataclass(frozen=True)
class ModelInfo:
    source: str  # what was asked for: "default" or a path
    fingerprint: str
    device: str
    dtype: str


@dataclass(frozen=True)
class PoolInfo:
    """RayEngine: the worker pool behind it."""

    mode: str  # the configured workers: ray, ray://ADDRESS, auto
    count: int
    retries: int  # calls retried on another actor after one died
    actors: list[dict]  # each actor's `worker` figures


@dataclass(frozen=True, eq=False)
class EngineStats(StatsView):
    engine: EngineCounters
    store: StoreStats
    model: ModelInfo
    codec: str
    workers: PoolInfo | None = None  # RayEngine only
    worker: dict | None = None  # one Ray actor's own figures (ChunkWorker.stats): computed, stored, waited, ...
    batch: BatchStats | None = None  # continuous batching (summed over Ray actors)
    chunk_form: str | None = None  # how chunk KV is computed (workers/chunk_forms.py)
    sequences: SequenceCounters | None = None  # exact reuse of leading chunk runs (workers/sequences.py)
    shadow: dict | None = None  # shadow verification's agreement per namespace (workers/shadow.py ShadowStats)
    adaptive: dict | None = None  # the adaptive ratio per namespace and its changes (workers/adaptive.py)

    def as_dict(self) -> dict:
        out = {"engine": asdict(self.engine), "store": self.store.as_dict(), "model": asdict(self.model),
               "codec": self.codec}
        if self.workers is not None:
            out["workers"] = asdict(self.workers)
        if self.worker is not None:
            out["worker"] = self.worker
        if self.batch is not None:
            out["batch"] = asdict(self.batch)
        if self.chunk_form is not None:
            out["chunk_form"] = self.chunk_form
        if self.sequences is not None:
            out["sequences"] = asdict(self.sequences)
        if self.shadow is not None:
            out["shadow"] = self.shadow
        if self.adaptive is not None:
            out["adaptive"] = self.adaptive
        return out
