"""16 concurrent SDK clients against a real `ragkv serve`: zero errors, the memory tier within budget.

`make test` runs the reduced size (ragkv.bench.load quick: 32 requests); `ragkv bench load` the full one."""

from __future__ import annotations

import pytest

from ragkv.bench import load

pytestmark = pytest.mark.timeout(900)


def test_sixteen_clients_mixed_ingest_and_generate_zero_errors(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the server subprocess: one torch thread on shared CPUs
    result = load.run(quick=True, progress=False, time_limit_s=600)
    assert result["clients"] == 16
    assert result["errors"] == 0, result["error_samples"]
    assert result["served"] == result["requests"] == 32
    assert result["latency_s"]["ingest"]["count"] > 0 and result["latency_s"]["generate"]["count"] > 0
    assert 0 < result["latency_s"]["p50"] <= result["latency_s"]["p99"]
    assert result["throughput_rps"] > 0
    assert result["server_peak_rss_mb"] and result["server_peak_rss_mb"] > 100
    tier = result["memory_tier"]
    assert tier["budget_bytes"] == load.MEMORY_BUDGET and tier["stats_polls"] > 0
    assert not tier["exceeded"] and 0 < tier["max_bytes_used_seen"] <= tier["budget_bytes"]
    print(result)
