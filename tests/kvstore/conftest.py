"""kvstore fixtures: real KV from the session's model, and one backend suite for every store."""

from __future__ import annotations

import pytest

from kvstore.kv import ChunkKV
from kvstore_helpers import TEXT


@pytest.fixture(scope="session")
def real_kv(runner) -> ChunkKV:
    """One real chunk (85 tokens) from the default model: [30, 3, 85, 64] float keys/values."""
    return runner.chunk_kv(runner.tokenize(TEXT))


@pytest.fixture(params=["disk", "redis", "memory"])
def backend_url(request, tmp_path) -> str:
    """The same backend suite runs against every store."""
    if request.param == "disk":
        return f"disk:{tmp_path / 'store'}"
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    return "memory:"
