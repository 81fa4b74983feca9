"""Redis Cluster backend: `redis+cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT...]` (`rediss+cluster://` for TLS).

The nodes listed are seeds; redis-py's `RedisCluster` discovers the rest, follows
MOVED/ASK redirects (a resharding in flight) and refreshes its slot map after a
failover. Nothing is sharded by hand: blocks fall into `?buckets=N` buckets
(default 64) of the layout in redis_index.py, each bucket's keys carrying one
hash tag, so a block's bytes and its index entries share a slot and a put is one
MULTI/EXEC on that slot's primary (data first). The tags are chosen so that the
buckets sit at evenly spaced slots: any contiguous split of the slots spreads
them evenly over the primaries. Batched reads are pipelined (redis-py groups
them per node). The byte budget and pins hold across the cluster. A node that
is down, or a slot whose primary is failing over, is BackendUnavailable for the
call that touches it (callers treat it as a miss and recompute); the client is
built lazily, so a store opened while the cluster is down recovers by itself.
`?prefix=` as for redis://. Keep `buckets` several times the number of primaries
(64 spreads well over up to ~16); changing it orphans what is stored.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from urllib.parse import parse_qs, unquote

from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.retry import Retry

from kvstore.backends.redis_index import Bucket, RedisIndexedBackend
from kvstore.backends.registry import register_backend

DEFAULT_BUCKETS = 64


def parse_cluster_url(url: str) -> dict:
    """{"nodes": [(host, port)], "username", "password", "ssl", "prefix", "buckets"} from a cluster URL."""
    scheme, sep, rest = url.partition("://")
    if scheme.lower() not in ("redis+cluster", "rediss+cluster") or not sep:
        raise ValueError("a cluster store URL reads redis+cluster://HOST:PORT[,HOST:PORT...]")
    netloc, _, query = rest.partition("?")
    netloc = netloc.rstrip("/").removesuffix("/0")
    if "/" in netloc:
        raise ValueError("a Redis Cluster has database 0 only: drop the /DB from the store URL")
    userinfo, _, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    nodes = []
    for hostport in filter(None, hosts.split(",")):
        host, colon, port = hostport.rpartition(":")
        if not colon or not port.isdigit() or not host:
            raise ValueError(f"cluster node {hostport!r} is not HOST:PORT")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError("a cluster store URL names at least one HOST:PORT")
    q = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(q) - {"prefix", "buckets"}
    if unknown:
        raise ValueError(f"unknown cluster store URL option(s): {', '.join(sorted(unknown))}")
    prefix = q.get("prefix", "ragkv:")
    if "{" in prefix or "}" in prefix:
        raise ValueError("the cluster store prefix may not contain { or } (they delimit hash tags)")
    buckets = int(q.get("buckets", DEFAULT_BUCKETS))
    if not 1 <= buckets <= REDIS_CLUSTER_HASH_SLOTS:
        raise ValueError(f"buckets must be in 1..{REDIS_CLUSTER_HASH_SLOTS}, got {buckets}")
    return {"nodes": nodes, "username": unquote(username) or None, "password": unquote(password) or None,
            "ssl": scheme.lower().startswith("rediss"), "prefix": prefix, "buckets": buckets}


@lru_cache(maxsize=8)
def bucket_tags(n: int) -> tuple[str, ...]:
    """n hash tags, the i-th hashing into the i-th of n equal slot ranges (deterministic)."""
    tags = []
    for i in range(n):
        j = 0
        while key_slot(f"{i}.{j}".encode()) * n // REDIS_CLUSTER_HASH_SLOTS != i:
            j += 1
        tags.append(f"{i}.{j}")
    return tuple(tags)


@register_backend("redis+cluster", "rediss+cluster")
class RedisClusterBackend(RedisIndexedBackend):
    scheme = "redis+cluster"

    def __init__(self, url: str, budget_bytes: int | None = None, socket_timeout: float = 5.0):
        self.options = parse_cluster_url(url)
        self.prefix = self.options["prefix"]
        tags = bucket_tags(self.options["buckets"])
        super().__init__(url, budget_bytes, [Bucket.named(f"{self.prefix}{{{t}}}") for t in tags])
        self.socket_timeout = socket_timeout
        self._r: RedisCluster | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, budget_bytes: int | None = None) -> "RedisClusterBackend":
        return cls(url, budget_bytes)

    def slot(self, key: str) -> int:
        """The hash slot of `key`'s bucket: its bytes and index entries all live there."""
        return key_slot(self.bucket(key).lru.encode())

    def client(self) -> RedisCluster:
        """Built on first use (and again after a failed build), so opening never needs the cluster up."""
        if self._r is None:
            with self._lock:
                if self._r is None:
                    o = self.options
                    self._r = RedisCluster(
                        startup_nodes=[ClusterNode(h, p) for h, p in o["nodes"]], username=o["username"],
                        password=o["password"], ssl=o["ssl"], require_full_coverage=False,
                        socket_timeout=self.socket_timeout, socket_connect_timeout=self.socket_timeout,
                        # a few quick retries; a dead node must not stall a request for long. A MOVED
                        # re-reads the slot map at once, so a retried transaction finds the new owner.
                        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 3), reinitialize_steps=1)
        return self._r

    def close(self) -> None:
        with self._lock:
            if self._r is not None:
                self._r.close()
                self._r = None


__all__ = ["RedisClusterBackend", "bucket_tags", "parse_cluster_url"]
