"""Admission control in front of the engine: one request computes, at most `max_queue` wait.

The engine is not safe for concurrent generation, so model work is serialized; a
request arriving when `max_queue` are already waiting is refused at once with
ResourceExhausted instead of piling up in gRPC's thread pool. A waiter whose RPC
is cancelled (deadline, client gone) leaves the queue without running.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from ragkv.errors import Cancelled, ResourceExhausted

POLL_S = 0.05


class Admission:
    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self._busy = False
        self._waiting = 0

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def in_flight(self) -> int:
        return int(self._busy)

    @contextmanager
    def slot(self, should_stop: Callable[[], bool] = lambda: False) -> Iterator[None]:
        with self._cond:
            if self._busy and self._waiting >= self.max_queue:
                raise ResourceExhausted(f"request queue is full ({self.max_queue} waiting); retry later")
            self._waiting += 1
            try:
                while self._busy:
                    self._cond.wait(POLL_S)
                    if should_stop():
                        raise Cancelled("request cancelled while queued")
            finally:
                self._waiting -= 1
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify()
