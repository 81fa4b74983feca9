"""Prometheus metrics for the server, in a registry of their own.

RPC counts come from RequestLogInterceptor; per-result figures (TTFT, chunk hits)
from `Instrumented(engine)`, a wrapper that observes what the engine returns;
store figures (bytes per backend, evictions) are read from `engine.stats()` at
scrape time by `StoreCollector`.
"""

from __future__ import annotations

import logging
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvstore.stats import StoreStats
from ragkv.server.reuse_metrics import ReuseCollector
from workers.stats import BatchStats
from workers.protocol import EngineProtocol

log = logging.getLogger("ragkv.server")

REJECT_REASONS = ("corrupt", "foreign", "token_mismatch")  # StoreCounters fields: blocks refused on read
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("ragkv_requests", "RPCs by method, generation mode and status code",
                                ["method", "mode", "code"], registry=r)
        self.latency = Histogram("ragkv_request_seconds", "RPC duration", ["method"], registry=r)
        self.ttft = Histogram("ragkv_ttft_seconds", "server-side time to first token", ["mode"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.chunks = Counter("ragkv_chunks", "chunks used by generation, by outcome (hit: KV loaded from the store)",
                              ["outcome"], registry=r)
        self.blend_runs = Counter("ragkv_blend_runs", "blend and reuse requests by what ran (stats blend_method: a "
                                  "selection method, reuse, shift, or exact: the server's setting served by an exact "
                                  "prefill)", ["ran"], registry=r)
        self.chunk_hit_ratio = Gauge("ragkv_chunk_hit_ratio", "fraction of chunks served from the store since start",
                                     registry=r)
        self.ingested = Counter("ragkv_ingested_chunks", "chunks ingested, by whether they were already stored",
                                ["cached"], registry=r)
        self._hits = 0
        self._total = 0

    def observe_rpc(self, method: str, mode: str, code: str, seconds: float) -> None:
        self.requests.labels(method=method, mode=mode, code=code).inc()
        self.latency.labels(method=method).observe(seconds)

    def observe_result(self, mode: str, result) -> None:
        stats = result.stats or {}
        self.ttft.labels(mode=mode).observe(float(result.ttft_s))
        hit, computed = int(stats.get("chunks_hit", 0) or 0), int(stats.get("chunks_computed", 0) or 0)
        self.chunks.labels(outcome="hit").inc(hit)
        self.chunks.labels(outcome="computed").inc(computed)
        if stats.get("blend_method"):
            self.blend_runs.labels(ran=stats["blend_method"]).inc()
        self._hits += hit
        self._total += hit + computed
        if self._total:
            self.chunk_hit_ratio.set(self._hits / self._total)

    def observe_ingest(self, refs) -> None:
        for ref in refs:
            self.ingested.labels(cached=str(bool(ref.cached)).lower()).inc()

    def watch(self, engine, admission=None) -> None:
        """Register the scrape-time collectors for `engine` (and the queue gauges for `admission`)."""
        self.registry.register(StoreCollector(engine))
        self.registry.register(BatchCollector(engine))
        self.registry.register(ReuseCollector(engine))
        if admission is not None:
            Gauge("ragkv_queue_waiting", "requests waiting for the engine", registry=self.registry
                  ).set_function(lambda: admission.waiting)
            Gauge("ragkv_in_flight", "requests holding the engine", registry=self.registry
                  ).set_function(lambda: admission.in_flight)


class StoreCollector(Collector):
    """Store figures at scrape time, read from the engine's typed stats (EngineStats.store)."""

    def __init__(self, engine: EngineProtocol):
        self.engine = engine

    def describe(self):  # the families without samples: registering must not call the engine
        return list(self._families())

    def collect(self):
        try:
            store = self.engine.stats().store
        except Exception:  # a scrape must not fail because the store is down
            log.warning("engine.stats() failed during a metrics scrape", exc_info=True)
            store = None
        return list(self._families(store))

    @staticmethod
    def _families(store: StoreStats | None = None) -> Iterator:
        stored = GaugeMetricFamily("ragkv_store_bytes", "bytes stored, per backend", labels=["backend"])
        blocks = GaugeMetricFamily("ragkv_store_blocks", "blocks stored, per backend", labels=["backend"])
        evictions = CounterMetricFamily("ragkv_store_evictions", "blocks evicted to stay in budget, per backend",
                                        labels=["backend"])
        rejected = CounterMetricFamily("ragkv_store_rejected_blocks",
                                       "stored blocks refused on read (damaged, other model, other tokens), by reason",
                                       labels=["reason"])
        for name, b in store.backend.backends() if store is not None and store.backend is not None else []:
            stored.add_metric([name], float(b.bytes_used))
            blocks.add_metric([name], float(b.blocks))
            evictions.add_metric([name], float(b.evictions))
        for reason in REJECT_REASONS:  # blocks the store refused to serve (deleted, then recomputed)
            rejected.add_metric([reason], float(getattr(store.counters, reason)) if store is not None else 0.0)
        yield from (stored, blocks, evictions, rejected)
        yield from StoreCollector._decoded(store)

    @staticmethod
    def _decoded(store: StoreStats | None) -> Iterator:
        """The decoded-KV tier (kvstore/decoded.py): what it holds, its budget, and how often it saved a decode."""
        tier = store.decoded if store is not None else None
        gauges = {"bytes_used": GaugeMetricFamily("ragkv_decoded_kv_bytes", "bytes of decoded chunk KV held"),
                  "budget_bytes": GaugeMetricFamily("ragkv_decoded_kv_budget_bytes",
                                                    "byte budget of the decoded chunk KV tier (0: off)"),
                  "blocks": GaugeMetricFamily("ragkv_decoded_kv_blocks", "decoded chunks held"),
                  "evictions": CounterMetricFamily("ragkv_decoded_kv_evictions",
                                                   "decoded chunks dropped to stay in budget")}
        for name, family in gauges.items():
            family.add_metric([], float(getattr(tier, name)) if tier is not None else 0.0)
        lookups = CounterMetricFamily("ragkv_decoded_kv_lookups", "block reads by decoded-tier outcome (hit: no decode)",
                                      labels=["outcome"])
        for field, outcome in (("hits", "hit"), ("misses", "miss")):
            lookups.add_metric([outcome], float(getattr(tier, field)) if tier is not None else 0.0)
        yield from (*gauges.values(), lookups)


class BatchCollector(Collector):
    """The scheduler's figures at scrape time (EngineStats.batch): batch size, queue depth, step time."""

    def __init__(self, engine: EngineProtocol):
        self.engine = engine

    def describe(self):
        return list(self._families())

    def collect(self):
        try:
            batch = self.engine.stats().batch
        except Exception:
            log.warning("engine.stats() failed during a metrics scrape", exc_info=True)
            batch = None
        return list(self._families(batch))

    @staticmethod
    def _families(batch: BatchStats | None = None) -> Iterator:
        families = {"batch_size": (GaugeMetricFamily, "ragkv_batch_size", "requests in the last batched decode step"),
                    "running": (GaugeMetricFamily, "ragkv_batch_running", "requests in the running batch"),
                    "waiting": (GaugeMetricFamily, "ragkv_scheduler_waiting", "requests waiting for a place in the batch"),
                    "step_s": (GaugeMetricFamily, "ragkv_decode_step_seconds", "duration of the last batched decode step"),
                    "decode_steps": (CounterMetricFamily, "ragkv_decode_steps", "batched decode steps"),
                    "tokens": (CounterMetricFamily, "ragkv_decode_tokens", "tokens produced by batched decode steps"),
                    "prefills": (CounterMetricFamily, "ragkv_prefills", "prefills run by the scheduler")}
        for field_name, (kind, name, doc) in families.items():
            family = kind(name, doc)
            if batch is not None:
                family.add_metric([], float(getattr(batch, field_name)))
            yield family


class Instrumented:
    """The engine, with every result observed by `metrics`; other attributes delegate (an EngineProtocol)."""

    def __init__(self, engine: EngineProtocol, metrics: Metrics):
        self._engine = engine
        self._metrics = metrics

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def ingest(self, texts, *args, **kwargs):
        refs = self._engine.ingest(texts, *args, **kwargs)
        self._metrics.observe_ingest(refs)
        return refs

    def generate(self, req, *args, **kwargs):
        result = self._engine.generate(req, *args, **kwargs)
        self._metrics.observe_result(req.mode, result)
        return result

    def generate_stream(self, req, *args, **kwargs):
        for item in self._engine.generate_stream(req, *args, **kwargs):
            if not isinstance(item, str):
                self._metrics.observe_result(req.mode, item)
            yield item
