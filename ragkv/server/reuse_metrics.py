"""Prometheus figures of exact reuse and of what blending costs, read from `engine.stats()` at scrape time:
the sequence tree's hits (workers/sequences.py) and shadow verification's agreement per namespace
(workers/shadow.py) and the adaptive ratio (workers/adaptive.py)."""

from __future__ import annotations

import logging
from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from workers.protocol import EngineProtocol

log = logging.getLogger("ragkv.server")

SEQUENCE_COUNTERS = {"hits": "requests that found stored exact KV for their leading chunks",
                     "chunks": "chunks served exactly from the sequence tree",
                     "tokens": "prompt tokens served exactly from the sequence tree (their prefill saved)",
                     "bytes_stored": "bytes of exact sequence KV stored",
                     "fills": "idle-time exact prefills of blended prompts"}


class ReuseCollector(Collector):
    def __init__(self, engine: EngineProtocol):
        self.engine = engine

    def describe(self):  # the families without samples: registering must not call the engine
        return list(self._families(None, None, None))

    def collect(self):
        try:
            stats = self.engine.stats()
            sequences, shadow = getattr(stats, "sequences", None), getattr(stats, "shadow", None)
            adaptive = getattr(stats, "adaptive", None)
        except Exception:  # a scrape must not fail because the engine is busy or the store is down
            log.warning("engine.stats() failed during a metrics scrape", exc_info=True)
            sequences = shadow = adaptive = None
        return list(self._families(sequences, shadow, adaptive))

    @staticmethod
    def _families(sequences, shadow: dict | None, adaptive: dict | None) -> Iterator:
        for field, doc in SEQUENCE_COUNTERS.items():
            family = CounterMetricFamily(f"ragkv_sequence_{field}", doc)
            family.add_metric([], float(getattr(sequences, field)) if sequences is not None else 0.0)
            yield family
        checked = CounterMetricFamily("ragkv_shadow_checked", "blend answers re-checked against a full prefill",
                                      labels=["namespace"])
        first = GaugeMetricFamily("ragkv_shadow_first_token_agreement",
                                  "share of checked blend answers whose first token is full's", labels=["namespace"])
        answer = GaugeMetricFamily("ragkv_shadow_answer_agreement",
                                   "share of checked blend answers equal to full's, token for token",
                                   labels=["namespace"])
        kl = GaugeMetricFamily("ragkv_shadow_mean_kl", "mean KL(full || blend) of the first token", labels=["namespace"])
        dropped = CounterMetricFamily("ragkv_shadow_dropped", "sampled checks dropped: the idle queue was full")
        dropped.add_metric([], float(shadow["dropped"]) if shadow else 0.0)
        for namespace, figures in (shadow or {}).get("namespaces", {}).items():
            checked.add_metric([namespace], float(figures["checked"]))
            first.add_metric([namespace], figures["first_token_agreement"])
            answer.add_metric([namespace], figures["answer_agreement"])
            kl.add_metric([namespace], figures["mean_kl"])
        ratio = GaugeMetricFamily("ragkv_adaptive_ratio", "the recompute ratio the adaptive controller holds "
                                  "(workers/adaptive.py)", labels=["namespace"])
        changes = CounterMetricFamily("ragkv_adaptive_changes", "adaptive ratio changes, every namespace")
        changes.add_metric([], float(adaptive["changed"]) if adaptive else 0.0)
        for namespace, state in (adaptive or {}).get("namespaces", {}).items():
            ratio.add_metric([namespace], state["ratio"])
        yield from (checked, first, answer, kl, dropped, ratio, changes)
