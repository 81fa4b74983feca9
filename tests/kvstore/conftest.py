"""kvstore fixtures: real KV from the session's model, and one backend suite for every store."""

from __future__ import annotations

import pytest

from kvstore.kv import ChunkKV
from kvstore.testing import RedisCluster
from kvstore_helpers import TEXT


@pytest.fixture(scope="session")
def real_kv(runner) -> ChunkKV:
    """One real chunk (85 tokens) from the default model: [30, 3, 85, 64] float keys/values."""
    return runner.chunk_kv(runner.tokenize(TEXT))


@pytest.fixture(scope="session")
def redis_cluster():
    """A real Redis Cluster on loopback: 3 primaries + 3 replicas, started once, always killed at the end."""
    with RedisCluster(primaries=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster_url(redis_cluster) -> str:
    """The session's cluster, every primary flushed."""
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture(params=["disk", "redis", "redis+cluster", "memory"])
def backend_url(request, tmp_path) -> str:
    """The same backend suite runs against every store."""
    if request.param == "disk":
        return f"disk:{tmp_path / 'store'}"
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    if request.param == "redis+cluster":
        return request.getfixturevalue("redis_cluster_url")
    return "memory:"
