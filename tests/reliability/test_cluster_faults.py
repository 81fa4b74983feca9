"""Redis Cluster faults injected for real on a loopback cluster (kvstore.testing.RedisCluster) under an
in-process Engine: a primary SIGKILLed while ingesting and generating (its replica takes over), and a slot
migrated key by key while blocks are read. Answers equal the fault-free tokens; nothing stored reads as
wrong bytes: a read is a hit of the right block or a miss."""

from __future__ import annotations

import random
import threading
import time

import pytest

from faults import engine_fingerprints
from test_store_faults import CHUNKS, MORE, engine_on, request

from kvstore.backends import BackendUnavailable, open_backend
from kvstore.block import decode_block
from kvstore.testing import RedisCluster

pytestmark = pytest.mark.timeout(300)


def assert_only_right_blocks(engine, reference: dict[str, bytes], scan: bool = True) -> int:
    """Each reference address reads as its fault-free bytes or as a miss; with `scan`, every stored block
    decodes too (checksum; the fingerprint of the engine's chunk or prefix store). Returns how many
    reference blocks are there."""
    store = engine.store
    for key in store.backend.keys() if scan else ():
        data = store.backend.get(key)
        if data is not None:
            _, header = decode_block(data)
            assert header.fingerprint in engine_fingerprints(engine)
    found = 0
    for key, want in reference.items():
        data = store.backend.get(key)
        assert data is None or data == want, f"block {key[:12]} reads as other bytes"
        found += data is not None
    return found


def _until_readable(backend, key: str, timeout_s: float = 30.0) -> None:
    """Read `key` until the backend answers (a hit or a miss) instead of raising BackendUnavailable."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            backend.get(key)
            return
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_primary_killed_while_ingesting_and_generating(runner, monkeypatch):
    """SIGKILL the primary holding a chunk's block right after the cluster took the first put of an
    ingest; generate while it is down (its replica held back), then let the replica take over."""
    with RedisCluster(primaries=3, replicas=1, node_timeout_ms=1000) as cluster:
        engine = engine_on(cluster.url, runner)
        backend = engine.store.backend
        clean = engine.generate(request())  # fault-free, cold: every chunk computed and stored
        assert clean.stats["chunks_computed"] == 3 and not clean.stats["degraded"]
        reference = {k: backend.get(k) for k in backend.keys()}  # the fault-free bytes of what is stored
        assert len(reference) == 4  # the three chunks and the system-prompt prefix
        more = MORE[:2]  # the model dominates this test's time on a shared CPU: few chunks
        for text in more:
            tokens = runner.tokenize(text)
            reference[engine.store.address_for(tokens)] = engine.compute_block(tokens)

        slot = backend.slot(engine.store.address_for(runner.tokenize(CHUNKS[1])))
        victim = cluster.node_for_slot(slot)
        [replica] = cluster.replicas_of(victim)
        cluster.client(replica).config_set("cluster-replica-no-failover", "yes")  # the outage lasts till we say
        real_put_many, killed = backend.put_many, []

        def put_then_kill(items):  # SIGKILL the primary right after the first block of the ingest is stored
            real_put_many(items)
            if not killed:
                victim.kill()
                killed.append(victim.port)

        monkeypatch.setattr(backend, "put_many", put_then_kill)
        refs = engine.ingest(more)  # every chunk answered although a primary died under it
        monkeypatch.undo()
        assert killed and len(refs) == len(more)

        down = engine.generate(request())  # CHUNKS[1]'s slot has no primary: a miss, recomputed
        assert down.stats["degraded"] and down.stats["chunks_computed"] >= 1
        assert down.token_ids == clean.token_ids
        assert_only_right_blocks(engine, {k: v for k, v in reference.items()
                                                if cluster.node_for_slot(backend.slot(k)) is not victim}, scan=False)

        cluster.client(replica).config_set("cluster-replica-no-failover", "no")
        cluster.wait_ok(30)  # the replica was elected: 3 primaries again, every node agrees
        assert cluster.roles()[replica.port] == "master" and cluster.node_for_slot(slot) is replica
        # the engine's client learns the new primary from its first failed read (a retry re-reads the slot
        # map); on a loaded CPU that can outlast one request's retries, which then computes: wait for it here
        _until_readable(backend, engine.store.address_for(runner.tokenize(CHUNKS[1])))

        again = engine.generate(request())
        assert again.token_ids == clean.token_ids and not again.stats["degraded"]
        assert assert_only_right_blocks(engine, reference) >= 1  # acknowledged: right bytes or a miss
        engine.ingest(more)  # what the kill lost is recomputed and stored on the new primary
        assert assert_only_right_blocks(engine, reference) == len(reference)
        assert engine.store.counters.corrupt == 0


def key(i: int) -> str:
    return f"{i:064x}"


def test_slot_migration_during_reads_serves_right_bytes_or_misses():
    """Move one bucket's slot to another primary key by key (MIGRATING/IMPORTING, ASK redirects) while a
    reader reads that bucket and others, and rewrites that bucket's blocks."""
    rng = random.Random(0)
    with RedisCluster(primaries=3, replicas=0) as cluster:
        backend = open_backend(cluster.url)
        bucket = backend.buckets[0]
        moving = [k for k in map(key, range(4000)) if backend.bucket(k) == bucket][:8]
        others = [k for k in map(key, range(24)) if backend.bucket(k) != bucket]
        expected = {k: rng.randbytes(rng.randrange(5_000, 20_000)) for k in moving + others}
        backend.put_many(expected.items())
        slot = backend.slot(moving[0])
        source = cluster.node_for_slot(slot)
        target = next(n for n in cluster.primary_nodes() if n is not source)
        stop = threading.Event()
        tally = {"hit": 0, "miss": 0, "wrong": 0, "rounds": 0, "put_ok": 0, "put_unavailable": 0}

        def reader():
            client = open_backend(cluster.url)
            while not stop.is_set():
                for k, data in zip(expected, client.get_many(expected)):
                    tally["hit" if data == expected[k] else "miss" if data is None else "wrong"] += 1
                k = moving[tally["rounds"] % len(moving)]
                try:  # a transaction cannot span a half-moved slot: stored, or refused as unavailable
                    client.put(k, expected[k])
                    tally["put_ok"] += 1
                except BackendUnavailable:
                    tally["put_unavailable"] += 1
                tally["rounds"] += 1
            client.close()

        def wait_for_a_round():  # after each key moved: at least one full round of reads sees that state
            seen, deadline = tally["rounds"], time.monotonic() + 30
            while tally["rounds"] <= seen + 1 and time.monotonic() < deadline and t.is_alive():
                time.sleep(0.005)

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        wait_for_a_round()
        before = dict(tally)
        moved = cluster.migrate_slot(slot, target, on_key=wait_for_a_round)
        stop.set()
        t.join(30)

        assert moved == len(moving) + 3  # the blocks and the bucket's lru, size and used keys (no pins yet)
        assert tally["rounds"] - before["rounds"] >= moved, "the reads did not overlap the migration"
        assert tally["wrong"] == 0 and tally["hit"] > before["hit"]
        assert cluster.node_for_slot(slot) is target
        assert backend.get_many(expected) == list(expected.values())  # everything still there, now on target
        backend.put(moving[0], expected[moving[0]])  # and writable again
        assert set(backend.keys()) == set(expected) and backend.stats()["blocks"] == len(expected)
        assert backend.stats()["bytes_used"] == sum(map(len, expected.values()))
