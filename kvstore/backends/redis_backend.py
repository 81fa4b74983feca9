"""Redis backend (`redis://[:PASSWORD@]HOST:PORT/DB`, `rediss://` for TLS).

Per block, with prefix P (default "ragkv:", `?prefix=` in the URL to change it):
    P b:KEY   the block bytes (written first)
    P lru     sorted set KEY -> last access time (the LRU index)
    P size    hash KEY -> byte length
    P pins    set of pinned KEYs
    P used    total bytes of indexed blocks
A put writes the data key and its index entries in one MULTI/EXEC, data first;
a get reads data + size in one round trip and treats any missing or
inconsistent part as a miss, so a half-written block is never served.
Eviction is planned client-side: with several writers racing on a tight
budget the `used` counter can drift until the next delete/put of those keys.
The password never appears in repr() or in error messages.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis

from kvstore.backends.base import Backend, BackendUnavailable, LRUIndex, StoreFullError, check_key
from kvstore.backends.registry import register_backend


def redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:" if parts.username else ":"
    return urlunsplit((parts.scheme, f"{user}***@{host}", parts.path, parts.query, parts.fragment))


@contextmanager
def _unavailable_on_error(where: str):
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
        raise BackendUnavailable(f"redis store unavailable ({where}): {type(e).__name__}") from None


@register_backend("redis", "rediss")
class RedisBackend(Backend):
    scheme = "redis"

    def __init__(self, url: str, budget_bytes: int | None = None, prefix: str | None = None,
                 socket_timeout: float = 5.0):
        query = parse_qs(urlsplit(url).query)
        self.prefix = prefix if prefix is not None else query.pop("prefix", ["ragkv:"])[0]
        self._url = url
        self._budget = LRUIndex(budget_bytes).budget  # validates
        clean = urlunsplit(urlsplit(url)._replace(query="&".join(f"{k}={v[0]}" for k, v in query.items())))
        self.pool = redis.ConnectionPool.from_url(clean, socket_timeout=socket_timeout,
                                                  socket_connect_timeout=socket_timeout)
        self.r = redis.Redis(connection_pool=self.pool)
        self.hits = self.misses = self.evictions = 0
        p = self.prefix
        self.k_lru, self.k_size, self.k_pins, self.k_used = p + "lru", p + "size", p + "pins", p + "used"

    @classmethod
    def from_url(cls, url: str, budget_bytes: int | None = None) -> "RedisBackend":
        return cls(url, budget_bytes)

    def _data_key(self, key: str) -> str:
        return self.prefix + "b:" + check_key(key)

    def __repr__(self) -> str:
        return f"RedisBackend({redact_url(self._url)!r}, budget_bytes={self._budget})"

    # -- reads ----------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        return self.get_many([key])[0]

    def get_many(self, keys) -> list[bytes | None]:
        keys = list(keys)
        if not keys:
            return []
        now = time.time()
        with _unavailable_on_error("get"):
            pipe = self.r.pipeline(transaction=False)
            for key in keys:
                pipe.get(self._data_key(key))
                pipe.hget(self.k_size, key)
                pipe.zadd(self.k_lru, {key: now}, xx=True)  # bump LRU only if indexed
            res = pipe.execute()
        out: list[bytes | None] = []
        for i in range(len(keys)):
            data, size = res[3 * i], res[3 * i + 1]
            ok = data is not None and size is not None and int(size) == len(data)
            out.append(data if ok else None)
            if ok:
                self.hits += 1
            else:
                self.misses += 1
        return out

    def contains(self, key: str) -> bool:
        with _unavailable_on_error("contains"):
            pipe = self.r.pipeline(transaction=False)
            pipe.exists(self._data_key(key))
            pipe.hexists(self.k_size, key)
            return all(pipe.execute())

    def keys(self) -> Iterator[str]:
        with _unavailable_on_error("keys"):
            return iter([k.decode() for k in self.r.zrange(self.k_lru, 0, -1)])

    def stats(self) -> dict:
        with _unavailable_on_error("stats"):
            pipe = self.r.pipeline(transaction=False)
            pipe.get(self.k_used)
            pipe.zcard(self.k_lru)
            pipe.scard(self.k_pins)
            used, blocks, pinned = pipe.execute()
        return {"backend": "redis", "bytes_used": int(used or 0), "budget_bytes": self._budget, "blocks": blocks,
                "pinned": pinned, "evictions": self.evictions, "hits": self.hits, "misses": self.misses}

    # -- writes ---------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        self.put_many([(key, data)])

    def put_many(self, items) -> None:
        items = [(check_key(k), bytes(d)) for k, d in items]
        if not items:
            return
        with _unavailable_on_error("put"):
            old = self.r.hmget(self.k_size, [k for k, _ in items])
            delta = sum(len(d) for _, d in items) - sum(int(o or 0) for o in old)
            if self._budget is not None:
                self._evict_for(delta, {k for k, _ in items})
            now = time.time()
            pipe = self.r.pipeline(transaction=True)
            for key, data in items:
                pipe.set(self._data_key(key), data)  # data before its index entries
            pipe.zadd(self.k_lru, {key: now for key, _ in items})
            pipe.hset(self.k_size, mapping={key: len(data) for key, data in items})
            pipe.incrby(self.k_used, delta)
            pipe.execute()

    def _evict_for(self, delta: int, incoming: set[str]) -> None:
        used = int(self.r.get(self.k_used) or 0)
        over = used + delta - self._budget
        if over <= 0:
            return
        victims: list[tuple[str, int]] = []
        start, page = 0, 64
        while over > 0:
            cands = [k.decode() for k in self.r.zrange(self.k_lru, start, start + page - 1)]
            if not cands:
                raise StoreFullError(f"{delta} more bytes do not fit in redis budget {self._budget} "
                                     f"({used} used, the rest pinned)")
            pipe = self.r.pipeline(transaction=False)
            for k in cands:
                pipe.sismember(self.k_pins, k)
            pinned = pipe.execute()
            sizes = self.r.hmget(self.k_size, cands)
            for k, is_pinned, size in zip(cands, pinned, sizes):
                if over <= 0:
                    break
                if is_pinned or k in incoming:
                    continue
                victims.append((k, int(size or 0)))
                over -= int(size or 0)
            start += page
        self._delete_indexed(victims)
        self.evictions += len(victims)

    def _delete_indexed(self, victims: list[tuple[str, int]]) -> None:
        if not victims:
            return
        pipe = self.r.pipeline(transaction=True)
        keys = [k for k, _ in victims]
        pipe.zrem(self.k_lru, *keys)  # index first: readers stop finding it before the data goes
        pipe.hdel(self.k_size, *keys)
        pipe.srem(self.k_pins, *keys)
        pipe.delete(*[self._data_key(k) for k in keys])
        pipe.decrby(self.k_used, sum(s for _, s in victims))
        pipe.execute()

    def delete(self, key: str) -> bool:
        with _unavailable_on_error("delete"):
            size = self.r.hget(self.k_size, check_key(key))
            existed = self.r.exists(self._data_key(key))
            self._delete_indexed([(key, int(size or 0))])
            return bool(existed)

    def pin(self, key: str) -> bool:
        with _unavailable_on_error("pin"):
            if not self.contains(key):
                return False
            self.r.sadd(self.k_pins, key)
            return True

    def unpin(self, key: str) -> bool:
        with _unavailable_on_error("unpin"):
            return bool(self.r.srem(self.k_pins, check_key(key)))

    def close(self) -> None:
        self.pool.disconnect()
