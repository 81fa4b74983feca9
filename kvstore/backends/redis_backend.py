"""Redis backend (`redis://[:PASSWORD@]HOST:PORT/DB`, `rediss://` for TLS).

One server, one bucket of the layout in redis_index.py, with prefix P (default
"ragkv:", `?prefix=` in the URL to change it): `P b:KEY` holds the block bytes,
`P lru` / `P size` / `P pins` / `P used` its index. A put writes the data key
and its index entries in one MULTI/EXEC, data first; a get reads data + size
in one round trip and treats any missing or inconsistent part as a miss, so a
half-written block is never served. The password never appears in repr() or
in error messages. For a Redis Cluster use `redis+cluster://` (redis_cluster.py).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis

from kvstore.backends.redis_index import Bucket, RedisIndexedBackend, redact_url
from kvstore.backends.registry import register_backend

__all__ = ["RedisBackend", "redact_url"]


@register_backend("redis", "rediss")
class RedisBackend(RedisIndexedBackend):
    scheme = "redis"

    def __init__(self, url: str, budget_bytes: int | None = None, prefix: str | None = None,
                 socket_timeout: float = 5.0):
        query = parse_qs(urlsplit(url).query)
        self.prefix = prefix if prefix is not None else query.pop("prefix", ["ragkv:"])[0]
        super().__init__(url, budget_bytes, [Bucket.named(self.prefix)])
        clean = urlunsplit(urlsplit(url)._replace(query="&".join(f"{k}={v[0]}" for k, v in query.items())))
        self.pool = redis.ConnectionPool.from_url(clean, socket_timeout=socket_timeout,
                                                  socket_connect_timeout=socket_timeout)
        self.r = redis.Redis(connection_pool=self.pool)

    @classmethod
    def from_url(cls, url: str, budget_bytes: int | None = None) -> "RedisBackend":
        return cls(url, budget_bytes)

    def client(self) -> redis.Redis:
        return self.r

    def close(self) -> None:
        self.pool.disconnect()
