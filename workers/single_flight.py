"""Single-flight per content address: concurrent requests for one chunk compute it once.

On a Redis store the lease is cluster-wide: `SET P lease:ADDR TOKEN NX PX ttl`;
the holder computes and stores the block, then deletes the lease (only if it
still holds it). Everyone else waits for the block to appear, or for the
lease to vanish (holder finished without storing, or died and the lease
expired) and then tries to take it. On any other store (disk, memory) the
lease is a lock in this process: good enough on a single node.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Callable
from urllib.parse import parse_qs, urlsplit, urlunsplit

_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class Leases:
    """Per-address leases; `run_once(address, is_stored, compute)` is the one method callers need."""

    def __init__(self, store_url: str | None, ttl_s: float = 30.0, poll_s: float = 0.05):
        self.ttl_s, self.poll_s = ttl_s, poll_s
        self._redis, self._prefix = _redis_client(store_url)
        self._local: dict[str, threading.Lock] = {}
        self._local_guard = threading.Lock()
        self._token = uuid.uuid4().hex

    @property
    def cluster_wide(self) -> bool:
        return self._redis is not None

    def _acquire(self, address: str) -> bool:
        if self._redis is not None:
            return bool(self._redis.set(self._prefix + "lease:" + address, self._token, nx=True,
                                        px=int(self.ttl_s * 1000)))
        with self._local_guard:
            lock = self._local.setdefault(address, threading.Lock())
        return lock.acquire(blocking=False)

    def _release(self, address: str) -> None:
        if self._redis is not None:
            self._redis.eval(_RELEASE, 1, self._prefix + "lease:" + address, self._token)
            return
        with self._local_guard:
            lock = self._local.pop(address, None)
        if lock is not None:
            lock.release()

    def held_elsewhere(self, address: str) -> bool:
        if self._redis is not None:
            return bool(self._redis.exists(self._prefix + "lease:" + address))
        with self._local_guard:
            lock = self._local.get(address)
        return lock is not None and lock.locked()

    def run_once(self, address: str, is_stored: Callable[[], bool], compute: Callable[[], None]) -> str:
        """-> "stored" (already there), "computed" (we did it) or "waited" (another holder did it).

        A holder that never finishes is outwaited after 2 x ttl, then we compute anyway.
        """
        deadline = time.monotonic() + 2 * self.ttl_s
        waited = False
        while True:
            if is_stored():
                return "waited" if waited else "stored"
            if self._acquire(address):
                try:
                    if is_stored():  # finished between our check and the lease
                        return "waited" if waited else "stored"
                    compute()
                    return "computed"
                finally:
                    self._release(address)
            if time.monotonic() > deadline:
                compute()
                return "computed"
            waited = True
            time.sleep(self.poll_s)


def _redis_client(store_url: str | None):
    """(client, key prefix) for a redis:// store URL, else (None, "")."""
    if not store_url or urlsplit(store_url).scheme not in ("redis", "rediss"):
        return None, ""
    import redis

    parts = urlsplit(store_url)
    query = parse_qs(parts.query)
    prefix = query.pop("prefix", ["ragkv:"])[0]
    clean = urlunsplit(parts._replace(query="&".join(f"{k}={v[0]}" for k, v in query.items())))
    return redis.Redis.from_url(clean, socket_timeout=5.0, socket_connect_timeout=5.0), prefix
