"""Session-wide fixtures: one loaded model, one real redis-server, temp cache dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvstore.testing import RedisServer


@pytest.fixture(scope="session", autouse=True)
def _ragkv_cache_dir(tmp_path_factory) -> Path:
    """Converted-model cache shared by the session (and kept across sessions when RAGKV_CACHE_DIR is set)."""
    if "RAGKV_CACHE_DIR" not in os.environ:
        os.environ["RAGKV_CACHE_DIR"] = str(Path.home() / ".cache" / "ragkv")
    return Path(os.environ["RAGKV_CACHE_DIR"])


@pytest.fixture(scope="session")
def runner():
    """The real default model, loaded once per test session."""
    from workers.runner import ModelRunner

    return ModelRunner.load("default")


@pytest.fixture(scope="session")
def gemma_runner():
    """The second named model (Gemma 3 270M), loaded once per session by the tests that need it."""
    from workers.runner import ModelRunner

    return ModelRunner.load("gemma3-270m")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """A clean database on the session's redis-server."""
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    return redis_server.url


@pytest.fixture(scope="module")
def ray_local():
    """A real local Ray (no dashboard, token auth off, short temp dir), for one test module."""
    ray = pytest.importorskip("ray")
    import shutil
    import tempfile

    os.environ["RAY_AUTH_MODE"] = "disabled"  # Ray 2.60 turns token auth on by default
    temp_dir = tempfile.mkdtemp(prefix="rk", dir="/tmp")  # unix socket paths are short: keep it under /tmp
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir,
             runtime_env={"env_vars": {"RAGKV_CACHE_DIR": os.environ["RAGKV_CACHE_DIR"]}})
    yield ray
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)
