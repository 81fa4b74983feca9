"""The engine interface: what the server calls, implemented by every engine.

Implementations: `workers.engine.Engine` (in process), `workers.ray_pool.RayEngine` (every
request on a Ray actor) and `ragkv.server.metrics.Instrumented` (a wrapper that observes
results). tests/workers/test_engine.py runs one suite against Engine and RayEngine.

Requests
    ingest(texts, pin=False, namespace="", compression=None) -> list[ChunkRef]
        `compression` (a query-agnostic CompressionSpec): chunks are stored already compressed.
    generate(request, should_stop=None) -> GenerateResult
    generate_stream(request, should_stop=None) -> Iterator[str | GenerateResult]   text pieces, then the result
        `should_stop()` is polled while generating; when it turns true the engine stops and raises Cancelled.
Block management (ids are content addresses; another namespace's ids are invisible)
    lookup(ids, namespace="") -> list[bool]
    pin(ids, namespace="") / unpin(ids, namespace="") / evict(ids, namespace="") -> int   blocks affected
Operations
    stats() -> EngineStats   typed (workers/stats.py); as_dict() is the Stats RPC's JSON: engine, store, model, codec, ...
    close() -> None

`ChunkCompute` is the strategy an Engine is given for chunks missing from the store (the Ray
WorkerPool); without one the engine computes them itself.

Types are imported for checking only, so this module imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from workers.requests import ChunkRef, CompressionSpec, GenerateRequest, GenerateResult
    from workers.stats import EngineStats

ShouldStop = Callable[[], bool]

ENGINE_METHODS = ("ingest", "generate", "generate_stream", "lookup", "pin", "unpin", "evict", "stats", "close")


@runtime_checkable
class EngineProtocol(Protocol):
    max_batch: int  # requests served at once (its scheduler's batch, summed over Ray actors)

    def ingest(self, texts: Sequence[str], pin: bool = False, namespace: str = "",
               compression: CompressionSpec | None = None) -> list[ChunkRef]: ...

    def generate(self, request: GenerateRequest, should_stop: ShouldStop | None = None) -> GenerateResult: ...

    def generate_stream(self, request: GenerateRequest,
                        should_stop: ShouldStop | None = None) -> Iterator[str | GenerateResult]: ...

    def lookup(self, ids: Sequence[str], namespace: str = "") -> list[bool]: ...

    def pin(self, ids: Sequence[str], namespace: str = "") -> int: ...

    def unpin(self, ids: Sequence[str], namespace: str = "") -> int: ...

    def evict(self, ids: Sequence[str], namespace: str = "") -> int: ...

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...


@runtime_checkable
class ChunkCompute(Protocol):
    def compute(self, token_lists: Sequence[Sequence[int]], namespace: str = "", pin: bool = False) -> list[dict]:
        """Make sure each chunk's block is in the shared store; one row per chunk (id, num_tokens, outcome, bytes)."""
        ...
