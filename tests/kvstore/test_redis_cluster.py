"""What only the Redis Cluster backend does: its URL, the hash-tag layout, blocks spread over the primaries,
one budget and one LRU across them. (The shared backend suite runs on the cluster in test_backends.py.)"""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from kvstore.backends import open_backend
from kvstore.backends.redis_cluster import bucket_tags, parse_cluster_url


def key(i: int) -> str:
    return f"{i:064x}"


def test_cluster_url():
    o = parse_cluster_url("redis+cluster://:p%40ss@10.0.0.1:7000,redis-1.ns.svc:7001?prefix=app:&buckets=16")
    assert o["nodes"] == [("10.0.0.1", 7000), ("redis-1.ns.svc", 7001)]
    assert (o["password"], o["username"], o["ssl"], o["prefix"], o["buckets"]) == ("p@ss", None, False, "app:", 16)
    o = parse_cluster_url("rediss+cluster://user:pw@[::1]:7000/0")
    assert o["nodes"] == [("::1", 7000)] and o["ssl"] and o["username"] == "user" and o["buckets"] == 64
    for bad in ("redis+cluster://", "redis+cluster://host", "redis+cluster://h:1/2", "redis+cluster://h:1?db=1",
                "redis+cluster://h:1?prefix={x}", "redis+cluster://h:1?buckets=0", "redis://h:1"):
        with pytest.raises(ValueError):
            parse_cluster_url(bad)


def test_bucket_tags_sit_at_evenly_spaced_slots():
    for n in (1, 3, 64, 256):
        tags = bucket_tags(n)
        assert len(set(tags)) == n
        assert [key_slot(t.encode()) * n // 16384 for t in tags] == list(range(n))


def test_a_blocks_bytes_and_index_share_one_slot(redis_cluster_url):
    b = open_backend(redis_cluster_url)
    for k in map(key, range(50)):
        bucket = b.bucket(k)
        names = [bucket.data(k), bucket.lru, bucket.size, bucket.pins, bucket.used]
        assert {key_slot(n.encode()) for n in names} == {b.slot(k)}
    assert len({b.slot(k) for k in map(key, range(50))}) > 20  # ...and blocks land in many slots
    b.close()


def test_blocks_spread_over_every_primary_and_one_budget_covers_them(redis_cluster, redis_cluster_url):
    b = open_backend(redis_cluster_url, budget_bytes=3000)
    primaries = redis_cluster.primary_nodes()
    by_node = {n.port: [] for n in primaries}
    for k in map(key, range(60)):
        by_node[redis_cluster.node_for_slot(b.slot(k)).port].append(k)
    assert all(len(ks) >= 5 for ks in by_node.values()), {p: len(ks) for p, ks in by_node.items()}
    a, c, d = (ks[0] for ks in by_node.values())  # three blocks on three different primaries
    b.put(a, b"a" * 1000)
    b.put(c, b"c" * 1000)
    b.put(d, b"d" * 1000)
    assert all(redis_cluster.client(n).dbsize() > 0 for n in primaries)
    b.get(a)  # a is the most recent now, c the oldest of the whole cluster
    assert b.pin(d)
    b.put(by_node[primaries[0].port][1], b"e" * 1000)  # over budget: evicts c, on another node
    assert not b.contains(c) and b.contains(a) and b.contains(d)
    s = b.stats()
    assert (s["blocks"], s["bytes_used"], s["pinned"], s["evictions"]) == (3, 3000, 1, 1)
    b.close()
