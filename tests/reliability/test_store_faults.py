"""Store faults injected for real under an in-process Engine: redis-server SIGKILLed while ingesting and
while generating, blocks damaged on disk and in Redis, a full byte budget, a full filesystem (tmpfs).
Every request must still answer, with exactly the tokens of the fault-free run."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest
import redis

from faults import MUTATIONS, check_disk_store

from kvstore.block import decode_block
from kvstore.testing import RedisServer, free_port
from ragkv.server.metrics import StoreCollector
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.requests import GenerateRequest

# these tests compare answers over the same chunks run twice: an idle-time exact prefill of a blended prompt
# (workers/sequences.py) would make the second exact; tests/workers/test_sequences.py covers that
SEQ = False

pytestmark = pytest.mark.timeout(300)

CHUNKS = ["The lighthouse on Varn Point was painted green in 1911.",
          "Orla keeps her bees on the roof of the old mill.",
          "The ferry to Kell leaves at seven every morning."]
MORE = [f"Fact number {i}: the stone at marker {i} weighs {i * 7} kilograms." for i in range(8)]


def request(chunks=CHUNKS, **kw) -> GenerateRequest:
    return GenerateRequest(question="When does the ferry leave?", chunks=tuple(chunks), max_new_tokens=4, **kw)


def engine_on(store: str, runner, **kw) -> Engine:
    """No memory tier: every read hits the backend. Blend reads the stored chunks at the default ratio (which the
    server's own setting serves exactly instead, reading none: BlendConfig.exact)."""
    return Engine(EngineConfig(store=store, memory_budget_bytes=None, sequence_cache=SEQ,
                               blend=BlendConfig(), **kw), runner)


def rejected(engine) -> dict:
    [family] = [f for f in StoreCollector(engine).collect() if f.name == "ragkv_store_rejected_blocks"]
    return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}


# -- Redis killed --------------------------------------------------------------------------------

def test_redis_killed_while_generating_recomputes_same_tokens_and_reconnects(runner, tmp_path):
    server = RedisServer(tmp_path / "redis", free_port(), persist=False).start()
    try:
        engine = engine_on(server.url, runner)
        clean = engine.generate(request())  # fault-free, cold: every chunk computed and stored
        assert clean.stats["chunks_computed"] == 3 and not clean.stats["degraded"]
        assert engine.generate(request()).stats["chunks_hit"] == 3

        server.kill()
        down = engine.generate(request())
        assert down.stats["degraded"] and down.stats["chunks_computed"] == 3
        assert down.token_ids == clean.token_ids  # recomputed: exactly the fault-free answer
        refs = engine.ingest(MORE[:2])  # ingest while down: answered, nothing claimed cached
        assert [r.cached for r in refs] == [False, False]
        assert engine.stats()["store"]["unavailable"] > 0

        server.start()  # same port, empty: the engine reconnects on its own
        again = engine.generate(request())
        assert not again.stats["degraded"] and again.token_ids == clean.token_ids
        assert engine.generate(request()).stats["chunks_hit"] == 3  # stored again after the restart
    finally:
        server.kill()


def test_redis_killed_mid_ingest_leaves_only_whole_blocks(runner, tmp_path):
    """AOF with fsync always: what Redis acknowledged survives the SIGKILL; nothing half-written decodes."""
    server = RedisServer(tmp_path / "redis", free_port(), persist=True).start()
    try:
        engine = engine_on(server.url, runner)
        watcher = redis.Redis.from_url(server.url)
        killed = threading.Event()

        def kill_after_two_puts():
            while not killed.is_set():
                calls = watcher.info("commandstats").get("cmdstat_exec", {}).get("calls", 0)
                if calls >= 2:
                    server.kill()
                    killed.set()
                time.sleep(0.005)

        t = threading.Thread(target=kill_after_two_puts, daemon=True)
        t.start()
        refs = engine.ingest(MORE)  # every chunk answered although the store died under it
        t.join(30)
        assert killed.is_set() and len(refs) == len(MORE)
        assert engine.store.degraded

        server.start()
        store = engine.store
        keys = list(store.backend.keys())
        assert 2 <= len(keys) < len(MORE)  # the kill landed mid-ingest
        for key in keys:
            kv, header = decode_block(store.backend.get(key), expected_fingerprint=store.fingerprint)
            assert store.address_for(header.token_ids) == key
        stats = store.backend.stats()
        sizes = redis.Redis.from_url(server.url).hvals("ragkv:size")
        assert stats["blocks"] == len(keys) and stats["bytes_used"] == sum(int(s) for s in sizes)
        again = engine.ingest(MORE)
        assert sum(r.cached for r in again) == len(keys) and not engine.store.degraded
        assert engine.store.counters.corrupt == 0
    finally:
        server.kill()


# -- damaged blocks ------------------------------------------------------------------------------

@pytest.fixture(params=["disk", "redis"])
def store_url(request, tmp_path):
    if request.param == "disk":
        yield f"disk:{tmp_path / 'blocks'}"
    else:
        server = RedisServer(tmp_path / "redis", free_port(), persist=False).start()
        yield server.url
        server.kill()


def damage(engine, key: str, mutate) -> None:
    """Rewrite the stored bytes in place: the file itself on disk; the value (with its index) in Redis."""
    backend = engine.store.backend
    data = backend.get(key)
    if backend.scheme == "disk":
        backend._path(key).write_bytes(mutate(data))
    else:
        backend.put(key, mutate(data))


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_damaged_block_is_detected_counted_deleted_and_recomputed(runner, store_url, mutation):
    engine = engine_on(store_url, runner)
    engine.generate(request())
    key = engine.store.address_for(runner.tokenize(CHUNKS[1]))
    engine.store.delete(key)
    clean = engine.generate(request())  # fault-free run of the same shape: chunk 1 absent, recomputed
    damage(engine, key, MUTATIONS[mutation])

    result = engine.generate(request())
    assert result.token_ids == clean.token_ids
    assert result.stats["chunks_hit"] == 2 and result.stats["chunks_computed"] == 1
    reason = "foreign" if mutation == "foreign_fingerprint" else "corrupt"
    assert getattr(engine.store.counters, reason) == 1
    assert rejected(engine)[reason] == 1  # ragkv_store_rejected_blocks{reason=...}
    # deleted, then replaced by the recomputed block, which decodes
    decode_block(engine.store.backend.get(key), expected_fingerprint=engine.store.fingerprint)
    assert engine.generate(request()).stats["chunks_hit"] == 3


def test_block_given_by_id_that_is_damaged_is_not_found_not_garbage(runner, store_url):
    engine = engine_on(store_url, runner)
    [ref] = engine.ingest([CHUNKS[0]])
    damage(engine, ref.id, MUTATIONS["flipped"])
    from ragkv.errors import NotFound

    with pytest.raises(NotFound):
        engine.generate(request(chunks=[ref.id]))
    assert engine.store.counters.corrupt == 1 and not engine.store.contains(ref.id)


def test_redis_value_without_its_index_is_never_served(runner, redis_url):
    """A torn write (data key set, index entries missing, or sizes disagreeing) reads as a miss."""
    engine = engine_on(redis_url, runner)
    engine.generate(request())
    key = engine.store.address_for(runner.tokenize(CHUNKS[2]))
    engine.store.delete(key)
    clean = engine.generate(request())  # same shape, fault-free: chunk 2 absent, recomputed, stored
    r = redis.Redis.from_url(redis_url)
    r.set("ragkv:b:" + key, r.get("ragkv:b:" + key)[:100])  # shorter than the indexed size
    result = engine.generate(request())
    assert result.stats["chunks_computed"] == 1 and result.token_ids == clean.token_ids


# -- full disk -----------------------------------------------------------------------------------

def test_byte_budget_full_of_pinned_blocks_still_answers_uncached(runner, tmp_path):
    root = tmp_path / "blocks"
    first = engine_on(f"disk:{root}", runner)
    first.ingest([CHUNKS[0]], pin=True)
    first.generate(request(chunks=[CHUNKS[0]]))  # stores the (pinned) system-prompt prefix block too
    used = first.store.backend.stats()["bytes_used"]
    unbounded = engine_on(f"disk:{root}", runner)
    clean = unbounded.generate(request(chunks=[CHUNKS[1]]))  # fault-free: prefix from the store, chunk computed
    assert unbounded.evict([unbounded.store.address_for(runner.tokenize(CHUNKS[1]))]) == 1

    engine = engine_on(f"disk:{root}", runner, store_budget_bytes=used)  # at the limit, all pinned
    [ref] = engine.ingest([CHUNKS[1]])
    assert not ref.cached and not engine.store.contains(ref.id)
    result = engine.generate(request(chunks=[CHUNKS[1]]))
    assert result.token_ids == clean.token_ids and result.stats["chunks_computed"] == 1
    summary = check_disk_store(root, engine)
    assert summary == {"blocks": 2, "pinned": 2, "bytes": used}  # the pinned chunk + pinned prefix, nothing else


@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode}): ENOSPC variant not run")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_enospc_is_a_miss_and_leaves_no_partial_files(runner, tiny_fs):
    root = tiny_fs / "blocks"
    engine = engine_on(f"disk:{root}", runner)
    engine.generate(request(chunks=[CHUNKS[2]]))  # stores the prefix + one chunk
    clean = engine.generate(request(chunks=[CHUNKS[2]]))  # fault-free, both from the store
    filler = tiny_fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the filesystem to the last page
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    os.sync()
    [ref] = engine.ingest([MORE[0]])  # its block cannot be written: ENOSPC
    assert not ref.cached and engine.store.degraded
    assert not engine.store.contains(ref.id)
    result = engine.generate(request(chunks=[MORE[0], CHUNKS[2]]))
    assert result.stats["chunks_computed"] == 1 and result.stats["chunks_hit"] == 1
    assert [p.name for p in root.glob("*/.*")] == []  # no temp file left behind, readable or not
    check_disk_store(root, engine)
    filler.unlink()
    assert engine.ingest([MORE[0]])[0].cached is False and engine.store.contains(ref.id)  # space back: stored
    assert not engine.store.degraded
    assert engine.generate(request(chunks=[CHUNKS[2]])).token_ids == clean.token_ids
