"""One backend suite for disk, redis, redis+cluster and memory; then what only some of them can do."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvstore.backends import BackendUnavailable, MemoryBackend, MemoryTier, StoreFullError, open_backend

ROOT = Path(__file__).resolve().parents[2]


def key(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture
def backend(backend_url):
    b = open_backend(backend_url)
    yield b
    b.close()


def test_put_get_contains_delete(backend):
    assert backend.get(key(1)) is None and not backend.contains(key(1))
    backend.put(key(1), b"one")
    backend.put(key(2), b"two" * 100)
    assert backend.get(key(1)) == b"one" and backend.contains(key(1))
    assert set(backend.keys()) == {key(1), key(2)}
    backend.put(key(1), b"uno!")  # overwrite
    assert backend.get(key(1)) == b"uno!"
    assert backend.stats()["bytes_used"] == 4 + 300
    assert backend.delete(key(1)) and not backend.delete(key(1))
    assert backend.get(key(1)) is None
    s = backend.stats()
    assert s["blocks"] == 1 and s["bytes_used"] == 300
    for field in ("bytes_used", "budget_bytes", "blocks", "pinned", "evictions", "hits", "misses"):
        assert field in s


def test_batch_get_put(backend):
    backend.put_many([(key(i), bytes([i]) * (i + 1)) for i in range(5)])
    assert backend.get_many([key(0), key(9), key(4)]) == [b"\0", None, b"\4" * 5]


def test_bad_keys_are_refused(backend):
    for bad in ("", "../etc/passwd", "a/b", ".hidden", "x" * 300):
        with pytest.raises(ValueError):
            backend.put(bad, b"x")


def test_lru_respects_budget_and_recency(backend_url):
    b = open_backend(backend_url, budget_bytes=350)
    for i in range(3):
        b.put(key(i), b"x" * 100)
    b.get(key(0))  # key 0 is now the most recent; key 1 the oldest
    b.put(key(3), b"x" * 100)
    assert set(b.keys()) == {key(0), key(2), key(3)}
    assert b.stats()["bytes_used"] <= 350 and b.stats()["evictions"] == 1
    b.close()


def test_pinned_blocks_are_never_evicted(backend_url):
    b = open_backend(backend_url, budget_bytes=300)
    for i in range(3):
        b.put(key(i), b"x" * 100)
    assert b.pin(key(0)) and b.pin(key(1))
    assert not b.pin(key(99))  # absent
    for i in range(3, 10):
        b.put(key(i), b"y" * 100)
        assert b.contains(key(0)) and b.contains(key(1))
        assert b.stats()["bytes_used"] <= 300
    b.pin(key(9))
    with pytest.raises(StoreFullError):
        b.put(key(10), b"z" * 100)
    with pytest.raises(StoreFullError):
        b.put(key(11), b"z" * 301)
    assert b.unpin(key(9))
    b.put(key(10), b"z" * 100)
    assert set(b.keys()) == {key(0), key(1), key(10)} and b.stats()["pinned"] == 2
    b.close()


def test_state_survives_reopen(backend_url):
    if backend_url.startswith("memory"):
        pytest.skip("memory: has nothing to reopen")
    b = open_backend(backend_url, budget_bytes=300)
    for i in range(3):
        b.put(key(i), b"x" * 100)
        time.sleep(0.01)  # distinct mtimes for the disk store's rebuilt LRU
    b.pin(key(0))
    b.close()
    b = open_backend(backend_url, budget_bytes=300)
    assert b.get(key(2)) == b"x" * 100 and b.stats()["pinned"] == 1 and b.stats()["bytes_used"] == 300
    b.put(key(3), b"y" * 100)  # evicts key 1: the oldest unpinned
    assert set(b.keys()) == {key(0), key(2), key(3)}
    b.close()


# -- MemoryTier ---------------------------------------------------------------------------

def test_memory_tier_read_through_and_budget(backend_url):
    inner = open_backend(backend_url)
    tier = MemoryTier(inner, budget_bytes=1000)
    rng = random.Random(0)
    for step in range(300):
        k = key(rng.randrange(40))
        if rng.random() < 0.4:
            tier.put(k, bytes([step % 256]) * rng.randrange(1, 400))
        else:
            assert tier.get(k) == inner.get(k)
        assert tier.cache.stats()["bytes_used"] <= 1000
    inner.put(key(100), b"only inner")
    assert tier.get(key(100)) == b"only inner" and tier.cache.contains(key(100))
    tier.put(key(101), b"z" * 5000)  # larger than the tier: stored below, not cached
    assert inner.get(key(101)) == b"z" * 5000 and not tier.cache.contains(key(101))
    assert tier.stats()["tier"]["bytes_used"] <= 1000
    tier.close()


# -- disk only: crash safety ---------------------------------------------------------------

def test_disk_leftover_temp_file_is_invisible_and_cleaned(tmp_path):
    b = open_backend(f"disk:{tmp_path}")
    b.put(key(1), b"complete")
    shard = tmp_path / key(2)[:2]
    shard.mkdir(exist_ok=True)
    (shard / f".{key(2)}.abc123.tmp").write_bytes(b"partial")  # a crash between write and rename
    assert b.get(key(2)) is None and not b.contains(key(2))
    b.close()
    b = open_backend(f"disk:{tmp_path}")
    assert list(b.keys()) == [key(1)] and not list(shard.glob("*.tmp"))


WRITER = """
import sys, time, os
from kvstore.backends.disk import DiskBackend
b = DiskBackend(sys.argv[1])
real_replace = os.replace
def slow_replace(src, dst):
    print("written", flush=True)
    time.sleep(60)  # killed here: the temp file is complete but never renamed
    real_replace(src, dst)
os.replace = slow_replace
b.put(sys.argv[2], b"x" * 100000)
"""


def test_disk_writer_killed_before_rename_leaves_no_block(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), key(7)], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert list(tmp_path.rglob("*.tmp"))  # the orphan is there...
    b = open_backend(f"disk:{tmp_path}")
    assert b.get(key(7)) is None and not list(b.keys())  # ...but never visible, and cleaned on open
    assert not list(tmp_path.rglob("*.tmp"))


# -- redis and redis+cluster only ---------------------------------------------------------------

@pytest.fixture(params=["redis", "redis+cluster"])
def redis_family_url(request) -> str:
    return request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")


def test_redis_half_written_block_is_a_miss(redis_family_url):
    b = open_backend(redis_family_url)
    r, data_key = b.client(), (lambda k: b.bucket(k).data(k))
    if b.scheme == "redis":
        assert data_key(key(1)) == "ragkv:b:" + key(1) and b.bucket(key(1)).size == "ragkv:size"  # the layout
    r.set(data_key(key(1)), b"data without index")
    assert b.get(key(1)) is None and not b.contains(key(1))
    b.put(key(2), b"complete")
    r.delete(data_key(key(2)))  # index without data
    assert b.get(key(2)) is None
    b.put(key(3), b"complete")
    r.set(data_key(key(3)), b"short")  # size disagrees with the index
    assert b.get(key(3)) is None


@pytest.mark.parametrize("url", ["redis://:hunter2@127.0.0.1:{0}/0",
                                 "redis+cluster://:hunter2@127.0.0.1:{0},127.0.0.1:{1}"])
def test_redis_down_is_unavailable_and_password_is_redacted(url):
    from kvstore.testing import free_port

    b = open_backend(url.format(free_port(), free_port()))  # opening needs no server
    assert "hunter2" not in repr(b) and "***" in repr(b)
    with pytest.raises(BackendUnavailable) as exc:
        b.get(key(1))
    assert "hunter2" not in str(exc.value)
    with pytest.raises(BackendUnavailable):
        b.put(key(1), b"x")
    with pytest.raises(BackendUnavailable):
        b.stats()


def test_unknown_scheme():
    with pytest.raises(ValueError):
        open_backend("s3://bucket")
    assert isinstance(open_backend("memory:"), MemoryBackend)
