"""Ray workers: actors that each load the model once and share one block store.

    pool = WorkerPool(EngineConfig(store="redis://..."), num_workers=2)
    pool.ingest(["text", ...])            # KV goes actor -> store; only ids come back
    pool.call("generate", request)        # a whole Engine request on one actor
    engine = make_engine(config)          # Engine (inproc) or RayEngine (same public methods)

Dispatch is load-aware (the actor with the fewest outstanding calls); an
actor that dies (RayActorError) is restarted by Ray (`max_restarts`) and the
call is retried on another actor. Chunk computation is single-flight per
content address across the cluster (workers/single_flight.py).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import replace
from typing import Callable, Iterator, Sequence

from workers.engine import Engine, EngineConfig
from workers.errors import Cancelled, InvalidArgument
from workers.protocol import ShouldStop
from workers.requests import ChunkRef, GenerateRequest, GenerateResult, is_chunk_id
from workers.stats import BatchStats, EngineCounters, EngineStats, PoolInfo

log = logging.getLogger("ragkv.ray")

MAX_RESTARTS = 4
MAX_TASK_RETRIES = 2
DEFAULT_LEASE_TTL_S = 30.0
STOP_POLL_S = 0.1  # how often a blocking call checks should_stop
SPARE_ACTOR_THREADS = 4  # actor threads beyond its batch: ingest, compute and stats calls are not stuck behind it
STORED_CHUNK_TOKENS = 256  # dispatch's estimate for a chunk given by id (the driver does not read blocks)


class ChunkWorker:
    """The actor body (made remote by WorkerPool): one model, one Engine, the shared store."""

    def __init__(self, config: EngineConfig, lease_ttl_s: float = DEFAULT_LEASE_TTL_S):
        import ray

        from workers.runner import ModelRunner
        from workers.single_flight import Leases

        device = "cuda" if ray.get_gpu_ids() else "cpu"  # explicit: never guess inside an actor
        self.config = replace(config, device=device, workers="inproc")
        self.engine = Engine(self.config, ModelRunner.load(self.config.model, device=device))
        self.leases = Leases(self.config.store, ttl_s=lease_ttl_s)
        self.counters = {"computed": 0, "stored": 0, "waited": 0, "bytes": 0, "tokens": 0}

    def ping(self) -> dict:
        return {"pid": os.getpid(), "device": str(self.engine.runner.device),
                "single_flight": "cluster" if self.leases.cluster_wide else "process"}

    def compute(self, token_lists: Sequence[Sequence[int]], namespace: str = "", pin: bool = False) -> list[dict]:
        """Make sure each chunk's block is in the store; one dict per chunk: id, num_tokens, outcome, bytes."""
        store, out = self.engine.store, []
        for token_ids in token_lists:
            token_ids = list(token_ids)
            address = store.address_for(token_ids, namespace)
            written = [0]

            def compute_and_put() -> None:
                data = self.engine.compute_block(token_ids)
                if store.put_raw(address, data):
                    written[0] = len(data)

            outcome = self.leases.run_once(address, lambda: store.contains(address), compute_and_put)
            if pin:
                store.pin(address)
            self.counters[outcome] += 1
            self.counters["bytes"] += written[0]
            self.counters["tokens"] += len(token_ids) if outcome == "computed" else 0
            out.append({"id": address, "num_tokens": len(token_ids), "outcome": outcome, "bytes": written[0]})
        return out

    def ingest(self, texts: Sequence[str], namespace: str = "", pin: bool = False) -> list[dict]:
        token_lists = [self.engine.tokenize_chunk(t, f"chunks[{i}]") for i, t in enumerate(texts)]
        return self.compute(token_lists, namespace, pin)

    def ingest_compressed(self, texts: Sequence[str], namespace: str, pin: bool, compression) -> list[ChunkRef]:
        """Chunks stored compressed at ingest (workers/eviction/chunks.py), by this actor's engine."""
        return self.engine.ingest(texts, pin=pin, namespace=namespace, compression=compression)

    def generate(self, request: GenerateRequest) -> GenerateResult:
        return self.engine.generate(request)

    def generate_stream(self, request: GenerateRequest):
        yield from self.engine.generate_stream(request)

    def admin(self, method: str, ids: Sequence[str], namespace: str = ""):
        if method not in ("lookup", "pin", "unpin", "evict"):
            raise ValueError(f"unknown admin method {method!r}")
        return getattr(self.engine, method)(ids, namespace)

    def stats(self) -> EngineStats:
        return replace(self.engine.stats(), worker={**self.counters, **self.ping()})


# -- cluster ---------------------------------------------------------------------
def ensure_ray(workers: str = "ray", **init_kwargs) -> None:
    """Connect to Ray once per process: `ray` = the cluster in RAY_ADDRESS / under a job, else a local one;
    `ray://HOST:PORT` = Ray Client; `auto` = an existing cluster (raises ConnectionError if none)."""
    import ray

    if ray.is_initialized():
        return
    env_vars = {k: os.environ[k] for k in ("RAGKV_CACHE_DIR", "HF_HUB_OFFLINE") if k in os.environ}
    kwargs = {"runtime_env": {"env_vars": env_vars}} if env_vars else {}
    kwargs.update(init_kwargs)
    if workers.startswith("ray://"):
        ray.init(address=workers, **kwargs)
    elif workers == "auto":
        ray.init(address="auto", **kwargs)
    elif workers == "ray":
        kwargs.setdefault("include_dashboard", False)
        ray.init(**kwargs)  # joins RAY_ADDRESS / the job's cluster if there is one, else starts a local one
    else:
        raise ValueError(f"workers must be inproc, ray, ray://ADDRESS or auto, got {workers!r}")


def default_num_workers() -> int:
    import ray

    if "RAGKV_RAY_WORKERS" in os.environ:
        return max(1, int(os.environ["RAGKV_RAY_WORKERS"]))
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    return gpus if gpus > 0 else max(1, min(4, int(resources.get("CPU", 1)) // 4))


class WorkerPool:
    def __init__(self, config: EngineConfig, num_workers: int | None = None,
                 lease_ttl_s: float = DEFAULT_LEASE_TTL_S, ready_timeout_s: float = 600.0):
        import ray

        self.config = config
        n = num_workers or default_num_workers()
        gpu = ray.cluster_resources().get("GPU", 0) > 0
        resources = {"num_gpus": 1} if gpu else {"num_cpus": 1}
        # a threaded actor: its engine's scheduler batches the generate calls that arrive together
        actor_cls = ray.remote(ChunkWorker).options(max_restarts=MAX_RESTARTS, max_task_retries=MAX_TASK_RETRIES,
                                                    max_concurrency=config.batch.max_batch + SPARE_ACTOR_THREADS,
                                                    **resources)
        self.actors = [actor_cls.remote(config, lease_ttl_s) for _ in range(n)]
        self._outstanding = [0] * n
        self._lock = threading.Lock()
        self._rr = itertools.count()
        self.retries = 0
        ray.get([a.ping.remote() for a in self.actors], timeout=ready_timeout_s)

    def __len__(self) -> int:
        return len(self.actors)

    # -- dispatch --------------------------------------------------------------
    def _pick(self, exclude: set[int], weight: int = 1) -> int:
        with self._lock:
            candidates = [i for i in range(len(self.actors)) if i not in exclude] or list(range(len(self.actors)))
            start = next(self._rr)
            # least outstanding work (tokens for generation); ties rotate so equal load spreads evenly
            index = min(candidates, key=lambda i: (self._outstanding[i], (i - start) % len(self.actors)))
            self._outstanding[index] += weight
            return index

    def _done(self, index: int, weight: int = 1) -> None:
        with self._lock:
            self._outstanding[index] -= weight

    def submit(self, method: str, *args, exclude: set[int] | None = None, weight: int = 1):
        """-> (actor index, ObjectRef); call `done(index, weight)` once the ref is resolved.
        weight: the call's share of an actor's work (generation: its estimated tokens, request_tokens)."""
        index = self._pick(exclude or set(), weight)
        return index, getattr(self.actors[index], method).remote(*args)

    done = _done

    def outstanding(self) -> list[int]:
        with self._lock:
            return list(self._outstanding)

    def call(self, method: str, *args, timeout: float | None = None, should_stop: ShouldStop | None = None,
             weight: int = 1):
        """Run one call on the least-loaded actor; on actor death retry it on another one.
        `should_stop()` is polled while waiting: when true the call is cancelled and Cancelled raised."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        tried: set[int] = set()
        for attempt in range(len(self.actors) + MAX_RESTARTS):
            index, ref = self.submit(method, *args, exclude=tried, weight=weight)
            try:
                if should_stop is not None:
                    _wait_unless_stopped(ref, should_stop, timeout)
                return ray.get(ref, timeout=timeout)
            except RayActorError as e:
                log.warning("actor %d failed on %s (%s); retrying elsewhere", index, method, type(e).__name__)
                tried.add(index)
                self.retries += 1
            except RayTaskError as e:
                raise _cause(e) from None
            finally:
                self._done(index, weight)
        raise RuntimeError(f"{method}: every worker failed")

    def map(self, method: str, batches: Sequence[tuple], on_result: Callable[[tuple, object], None] | None = None,
            per_actor: int = 2) -> list:
        """Run `method(*batch)` for every batch across the pool, `per_actor` in flight per actor; results in order.
        A batch whose actor dies is resubmitted to another actor."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        results: list = [None] * len(batches)
        pending = list(range(len(batches)))[::-1]
        inflight: dict = {}  # ref -> (batch index, actor index, tried)
        while pending or inflight:
            while pending and len(inflight) < per_actor * len(self.actors):
                b = pending.pop()
                index, ref = self.submit(method, *batches[b])
                inflight[ref] = (b, index, {index})
            ready, _ = ray.wait(list(inflight), num_returns=1)
            ref = ready[0]
            b, index, tried = inflight.pop(ref)
            self._done(index)
            try:
                results[b] = ray.get(ref)
            except RayActorError:
                self.retries += 1
                log.warning("actor %d died on batch %d; resubmitting", index, b)
                new_index, new_ref = self.submit(method, *batches[b], exclude=tried)
                inflight[new_ref] = (b, new_index, tried | {new_index})
                continue
            except RayTaskError as e:
                raise _cause(e) from None
            if on_result is not None:
                on_result(batches[b], results[b])
        return results

    # -- conveniences ----------------------------------------------------------
    def ingest(self, texts: Sequence[str], namespace: str = "", pin: bool = False) -> list[ChunkRef]:
        """Split across the actors, compute what is missing (once), return ChunkRefs in input order."""
        texts = list(texts)
        n = max(1, min(len(self.actors), len(texts)))
        step = -(-len(texts) // n)
        batches = [(texts[i:i + step], namespace, pin) for i in range(0, len(texts), step)]
        rows = [row for part in self.map("ingest", batches) for row in part]
        return [ChunkRef(id=r["id"], num_tokens=r["num_tokens"], cached=r["outcome"] != "computed") for r in rows]

    def compute(self, token_lists: Sequence[Sequence[int]], namespace: str = "", pin: bool = False) -> list[dict]:
        return self.call("compute", [list(t) for t in token_lists], namespace, pin)

    def stats(self) -> list[EngineStats]:
        return [self.call_on(i, "stats") for i in range(len(self.actors))]

    def call_on(self, index: int, method: str, *args, timeout: float | None = 60.0):
        import ray

        return ray.get(getattr(self.actors[index], method).remote(*args), timeout=timeout)

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []


def _wait_unless_stopped(ref, should_stop: ShouldStop, timeout: float | None) -> None:
    """Wait for `ref` (up to `timeout`), polling `should_stop`; cancel the task and raise Cancelled on a stop."""
    import ray

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if should_stop():
            ray.cancel(ref)  # a queued call is dropped; one already running on a sync actor runs to its end
            raise Cancelled("request cancelled")
        if ray.wait([ref], timeout=STOP_POLL_S)[0] or (deadline is not None and time.monotonic() > deadline):
            return  # ready, or ray.get raises its timeout


def _cause(error) -> BaseException:
    """The engine's own exception (InvalidArgument, NotFound, ...) out of a RayTaskError."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, Exception) else error


_POOLS: dict[tuple, WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(config: EngineConfig) -> WorkerPool:
    """One pool per process per (workers, model, store, codec): the Engine hook and RayEngine share it."""
    key = (config.workers, config.model, config.store, config.codec)
    with _POOLS_LOCK:
        if key not in _POOLS:
            ensure_ray(config.workers)
            _POOLS[key] = WorkerPool(config)
        return _POOLS[key]


def request_tokens(request: GenerateRequest) -> int:
    """A request's estimated tokens, for dispatch: the driver loads no tokenizer, so a text chunk counts
    ~4 characters a token and a chunk given by id STORED_CHUNK_TOKENS; plus every token it may generate."""
    prompt = sum(STORED_CHUNK_TOKENS if is_chunk_id(c) else len(c) // 4 + 1 for c in request.chunks)
    return prompt + (len(request.question) + len(request.system_prompt)) // 4 + request.max_new_tokens


class RayEngine:
    """An EngineProtocol (workers/protocol.py) whose every request runs on a pool actor (the driver loads no model)."""

    def __init__(self, config: EngineConfig, pool: WorkerPool | None = None):
        self.config = config
        self.pool = pool or pool_for(config)

    def ingest(self, texts: Sequence[str], pin: bool = False, namespace: str = "",
               compression=None) -> list[ChunkRef]:
        if not texts:
            raise InvalidArgument("chunks", "at least one chunk is required")
        if compression is not None:
            return self.pool.call("ingest_compressed", list(texts), namespace, pin, compression)
        return self.pool.ingest(texts, namespace, pin)

    @property
    def max_batch(self) -> int:
        return len(self.pool) * self.config.batch.max_batch

    def generate(self, request: GenerateRequest, should_stop: ShouldStop | None = None) -> GenerateResult:
        return self.pool.call("generate", request, should_stop=should_stop, weight=request_tokens(request))

    def generate_stream(self, request: GenerateRequest,
                        should_stop: ShouldStop | None = None) -> Iterator[str | GenerateResult]:
        """Pieces as the actor yields them (a Ray streaming generator); retried elsewhere only before the first."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        should_stop = should_stop or (lambda: False)
        tried: set[int] = set()
        weight = request_tokens(request)
        for _ in range(len(self.pool) + MAX_RESTARTS):
            index, gen = self.pool.submit("generate_stream", request, exclude=tried, weight=weight)
            started = False
            try:
                for ref in gen:
                    item = ray.get(ref)
                    started = True
                    yield item
                    if should_stop():
                        ray.cancel(gen)
                        raise Cancelled("request cancelled")
                return
            except RayActorError:
                if started:
                    raise
                tried.add(index)
            except RayTaskError as e:
                raise _cause(e) from None
            finally:
                self.pool.done(index, weight)
        raise RuntimeError("generate_stream: every worker failed")

    def _admin(self, method: str, ids: Sequence[str], namespace: str):
        return self.pool.call("admin", method, list(ids), namespace)

    def lookup(self, ids: Sequence[str], namespace: str = "") -> list[bool]:
        return self._admin("lookup", ids, namespace)

    def pin(self, ids: Sequence[str], namespace: str = "") -> int:
        return self._admin("pin", ids, namespace)

    def unpin(self, ids: Sequence[str], namespace: str = "") -> int:
        return self._admin("unpin", ids, namespace)

    def evict(self, ids: Sequence[str], namespace: str = "") -> int:
        return self._admin("evict", ids, namespace)

    def stats(self) -> EngineStats:
        """The actors' counters added up; the store and model as the first actor sees them (they share both)."""
        workers = self.pool.stats()
        pool = PoolInfo(self.config.workers, len(workers), self.pool.retries, [w.worker for w in workers])
        batch = sum((w.batch for w in workers if w.batch is not None), BatchStats())
        return replace(workers[0], engine=sum((w.engine for w in workers), EngineCounters()), codec=self.config.codec,
                       workers=pool, worker=None, batch=batch)

    def close(self) -> None:
        pass  # the pool is per process and outlives one engine; Ray tears actors down with the driver


def resolve_workers(workers: str) -> str:
    """`auto` joins a running cluster, or becomes `inproc` when none is up; other values pass through."""
    workers = workers or "inproc"
    if workers == "auto":
        try:
            ensure_ray("auto")
        except (ConnectionError, RuntimeError) as e:
            log.info("workers=auto: no Ray cluster (%s); running in process", e)
            return "inproc"
    return workers


def make_engine(config: EngineConfig, runner=None):
    """Engine for `workers="inproc"`, RayEngine for `ray`, `ray://ADDRESS`, and `auto` when a cluster is up."""
    if resolve_workers(config.workers) == "inproc":
        return Engine(replace(config, workers="inproc"), runner)
    return RayEngine(config)
