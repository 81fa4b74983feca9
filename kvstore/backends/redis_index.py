"""What the Redis backends share: the key layout, reads, writes and LRU eviction over buckets.

A bucket is the unit of atomicity: a block's bytes and its index entries live
in one bucket, and every write to a bucket is one MULTI/EXEC, data first.
With prefix P and bucket tag T ("" on one server; "{T}" on a cluster, so the
whole bucket hashes to one slot):
    P T b:KEY   the block bytes
    P T lru     sorted set KEY -> last access time (the LRU index)
    P T size    hash KEY -> byte length
    P T pins    set of pinned KEYs
    P T used    total bytes of the bucket's indexed blocks
A get reads data + size in one pipelined round trip (per node on a cluster)
and treats any missing or inconsistent part as a miss, so a half-written
block is never served. The byte budget covers all buckets: `used` is the sum
of the buckets' counters and eviction walks the buckets' LRU sets merged
oldest-first, skipping pins. Eviction is planned client-side: with several
writers racing on a tight budget a counter can drift until the next
delete/put of those keys. An unreachable server, node or slot is
BackendUnavailable (callers treat it as a miss); passwords never appear in
repr() or in error messages.
"""

from __future__ import annotations

import heapq
import time
import zlib
from abc import abstractmethod
from contextlib import contextmanager
from typing import Iterable, Iterator, NamedTuple

from redis import exceptions as rx

from kvstore.backends.base import Backend, BackendUnavailable, LRUIndex, StoreFullError, check_key
from kvstore.stats import BackendStats

# Transient trouble: a server/node down, a slot without a primary (failover in flight), a slot moving
# (a transaction cannot span a half-migrated slot: MOVED/ASK/TRYAGAIN once the client's retries are spent).
# Programming errors (cross-slot commands) are not in this list.
_UNAVAILABLE = (rx.ConnectionError, rx.TimeoutError, rx.ClusterError, rx.AskError, rx.TryAgainError,
                rx.ReadOnlyError, rx.SlotNotCoveredError, rx.RedisClusterException)
_BUGS = (rx.CrossSlotTransactionError, rx.InvalidPipelineStack)


def redact_url(url: str) -> str:
    """`redis://:***@host...`: the password (and only it) replaced, also in comma-separated node lists."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    userinfo, at, hosts = rest[:end].rpartition("@")
    if not sep or not at:
        return url
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{hosts}{rest[end:]}"


@contextmanager
def unavailable_on_error(where: str):
    try:
        yield
    except _BUGS:
        raise
    except _UNAVAILABLE as e:
        moved = isinstance(e, rx.MovedError)
        hint = " (a Redis Cluster answers MOVED to redis://: use redis+cluster://)" if moved else ""
        raise BackendUnavailable(f"redis store unavailable ({where}): {type(e).__name__}{hint}") from None


class Bucket(NamedTuple):
    """Key names of one bucket; `name` is everything before the field ("ragkv:" or "ragkv:{3.17}")."""
    name: str
    lru: str
    size: str
    pins: str
    used: str

    @classmethod
    def named(cls, name: str) -> "Bucket":
        return cls(name, *(name + field for field in cls._fields[1:]))

    def data(self, key: str) -> str:
        return self.name + "b:" + check_key(key)


class RedisIndexedBackend(Backend):
    """A byte store over `buckets` of a redis-py client; subclasses build the client and the buckets."""

    scheme = "redis"
    LRU_PAGE = 32  # LRU entries fetched per bucket at a time while planning an eviction

    def __init__(self, url: str, budget_bytes: int | None, buckets: list[Bucket]):
        self._url = url
        self._budget = LRUIndex(budget_bytes).budget  # validates
        self.buckets = buckets
        self.hits = self.misses = self.evictions = 0

    @abstractmethod
    def client(self):
        """The redis-py client (redis.Redis or redis.RedisCluster); may connect on first use."""

    def bucket(self, key: str) -> Bucket:
        if len(self.buckets) == 1:
            return self.buckets[0]
        return self.buckets[zlib.crc32(check_key(key).encode()) % len(self.buckets)]

    def _by_bucket(self, keys: Iterable[str]) -> dict[Bucket, list[str]]:
        groups: dict[Bucket, list[str]] = {}
        for key in keys:
            groups.setdefault(self.bucket(key), []).append(key)
        return groups

    def _pipeline(self):
        return self.client().pipeline(transaction=False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self._url)!r}, budget_bytes={self._budget})"

    # -- reads ----------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        return self.get_many([key])[0]

    def get_many(self, keys) -> list[bytes | None]:
        keys = list(keys)
        if not keys:
            return []
        now = time.time()
        with unavailable_on_error("get"):
            pipe = self._pipeline()
            for key in keys:
                b = self.bucket(key)
                pipe.get(b.data(key))
                pipe.hget(b.size, key)
                pipe.zadd(b.lru, {key: now}, xx=True)  # bump LRU only if indexed
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
        with unavailable_on_error("contains"):
            b = self.bucket(key)
            pipe = self._pipeline()
            pipe.exists(b.data(key))
            pipe.hexists(b.size, key)
            return all(pipe.execute())

    def keys(self) -> Iterator[str]:
        """Every indexed key, least recently used first."""
        with unavailable_on_error("keys"):
            pipe = self._pipeline()
            for b in self.buckets:
                pipe.zrange(b.lru, 0, -1, withscores=True)
            entries = [(score, k.decode()) for page in pipe.execute() for k, score in page]
        return iter([k for _, k in sorted(entries)])

    def stats(self) -> BackendStats:
        with unavailable_on_error("stats"):
            pipe = self._pipeline()
            for b in self.buckets:
                pipe.get(b.used)
                pipe.zcard(b.lru)
                pipe.scard(b.pins)
            res = pipe.execute()
        used, blocks, pinned = (sum(int(v or 0) for v in res[i::3]) for i in range(3))
        return BackendStats(self.scheme, bytes_used=used, budget_bytes=self._budget, blocks=blocks, pinned=pinned,
                            evictions=self.evictions, hits=self.hits, misses=self.misses)

    # -- writes ---------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        self.put_many([(key, data)])

    def put_many(self, items) -> None:
        items = {check_key(k): bytes(d) for k, d in items}
        if not items:
            return
        groups = self._by_bucket(items)
        with unavailable_on_error("put"):
            pipe = self._pipeline()
            for b, keys in groups.items():
                pipe.hmget(b.size, keys)
            olds = pipe.execute()
            deltas = {b: sum(len(items[k]) for k in keys) - sum(int(o or 0) for o in old)
                      for (b, keys), old in zip(groups.items(), olds)}
            if self._budget is not None:
                self._evict_for(sum(deltas.values()), set(items))
            now = time.time()
            for b, keys in groups.items():  # one transaction per bucket (a cluster: per slot)
                tx = self.client().pipeline(transaction=True)
                for key in keys:
                    tx.set(b.data(key), items[key])  # data before its index entries
                tx.zadd(b.lru, dict.fromkeys(keys, now))
                tx.hset(b.size, mapping={key: len(items[key]) for key in keys})
                tx.incrby(b.used, deltas[b])
                tx.execute()

    def _evict_for(self, delta: int, incoming: set[str]) -> None:
        pipe = self._pipeline()
        for b in self.buckets:
            pipe.get(b.used)
        used = sum(int(u or 0) for u in pipe.execute())
        over = used + delta - self._budget
        if over <= 0:
            return
        victims: dict[Bucket, list[tuple[str, int]]] = {}
        for key, size, b in self._unpinned_oldest_first():
            if key in incoming:
                continue
            victims.setdefault(b, []).append((key, size))
            over -= size
            if over <= 0:
                break
        else:
            raise StoreFullError(f"{delta} more bytes do not fit in redis budget {self._budget} "
                                 f"({used} used, the rest pinned)")
        for b, vs in victims.items():
            self._delete_indexed(b, vs)
            self.evictions += len(vs)

    def _unpinned_oldest_first(self) -> Iterator[tuple[str, int, Bucket]]:
        """(key, size, bucket) of unpinned blocks, oldest first: the buckets' LRU sets merged page by page."""
        heap: list[tuple[float, str, int, bool, int]] = []  # score, key, bucket index, last of page, size
        cursor = [0] * len(self.buckets)

        def load(indices: list[int]) -> None:
            pipe = self._pipeline()
            for i in indices:
                pipe.zrange(self.buckets[i].lru, cursor[i], cursor[i] + self.LRU_PAGE - 1, withscores=True)
            pages = [(i, [(k.decode(), s) for k, s in page]) for i, page in zip(indices, pipe.execute()) if page]
            pipe = self._pipeline()
            for i, page in pages:
                for k, _ in page:
                    pipe.sismember(self.buckets[i].pins, k)
                pipe.hmget(self.buckets[i].size, [k for k, _ in page])
            meta = iter(pipe.execute())
            for i, page in pages:
                pinned = [next(meta) for _ in page]
                sizes = next(meta)
                cursor[i] += len(page)
                full = len(page) == self.LRU_PAGE
                for j, ((k, score), is_pinned, size) in enumerate(zip(page, pinned, sizes)):
                    if not is_pinned:
                        heapq.heappush(heap, (score, k, i, False, int(size or 0)))
                if full:  # a marker after the page's last entry: the next page loads before anything newer
                    heapq.heappush(heap, (page[-1][1], "\U0010ffff", i, True, 0))

        load(list(range(len(self.buckets))))
        while heap:
            _, key, i, more, size = heapq.heappop(heap)
            if more:
                load([i])
            else:
                yield key, size, self.buckets[i]

    def _delete_indexed(self, b: Bucket, victims: list[tuple[str, int]]) -> None:
        if not victims:
            return
        keys = [k for k, _ in victims]
        tx = self.client().pipeline(transaction=True)
        tx.zrem(b.lru, *keys)  # index first: readers stop finding it before the data goes
        tx.hdel(b.size, *keys)
        tx.srem(b.pins, *keys)
        tx.delete(*[b.data(k) for k in keys])
        tx.decrby(b.used, sum(s for _, s in victims))
        tx.execute()

    def delete(self, key: str) -> bool:
        with unavailable_on_error("delete"):
            b = self.bucket(key)
            pipe = self._pipeline()
            pipe.hget(b.size, key)
            pipe.exists(b.data(key))
            size, existed = pipe.execute()
            self._delete_indexed(b, [(key, int(size or 0))])
            return bool(existed)

    def pin(self, key: str) -> bool:
        with unavailable_on_error("pin"):
            if not self.contains(key):
                return False
            self.client().sadd(self.bucket(key).pins, key)
            return True

    def unpin(self, key: str) -> bool:
        with unavailable_on_error("unpin"):
            return bool(self.client().srem(self.bucket(key).pins, check_key(key)))

