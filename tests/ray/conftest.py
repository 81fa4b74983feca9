"""Worker actors for the tests in this folder, on the real local Ray of tests/conftest.py (`ray_local`)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def pool(ray_local, redis_server):
    """Two worker actors over the session's redis-server (at most 2 actors: each holds the model)."""
    from workers.engine import EngineConfig
    from workers.ray_pool import WorkerPool

    p = WorkerPool(EngineConfig(store=redis_server.url, memory_budget_bytes=None, sequence_cache=False), num_workers=2, lease_ttl_s=5.0)
    yield p
    p.shutdown()
