"""A real local Ray for the tests in this folder (no dashboard, token auth off, short temp dir)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_local():
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"  # Ray 2.60 turns token auth on by default
    temp_dir = tempfile.mkdtemp(prefix="rk", dir="/tmp")  # unix socket paths are short: keep it under /tmp
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir,
             runtime_env={"env_vars": {"RAGKV_CACHE_DIR": os.environ["RAGKV_CACHE_DIR"]}})
    yield ray
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def pool(ray_local, redis_server):
    """Two worker actors over the session's redis-server (at most 2 actors: each holds the model)."""
    from workers.engine import EngineConfig
    from workers.ray_pool import WorkerPool

    p = WorkerPool(EngineConfig(store=redis_server.url, memory_budget_bytes=None), num_workers=2, lease_ttl_s=5.0)
    yield p
    p.shutdown()
