"""Admission control in front of the engine: `slots` requests are served at once, at most `max_queue` wait.

`slots` is the engine's batch size (its scheduler decodes that many requests together); a
request arriving when every slot is taken and `max_queue` are already waiting is refused at once
with ResourceExhausted instead of piling up in gRPC's thread pool. A waiter whose RPC is
cancelled (deadline, client gone) leaves the queue without running.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from ragkv.errors import Cancelled, ResourceExhausted

POLL_S = 0.05


class Admission:
    def __init__(self, max_queue: int, slots: int = 1):
        self.max_queue = max_queue
        self.slots = slots
        self._cond = threading.Condition()
        self._busy = 0
        self._waiting = 0

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def in_flight(self) -> int:
        return self._busy

    @contextmanager
    def slot(self, should_stop: Callable[[], bool] = lambda: False) -> Iterator[None]:
        with self._cond:
            if self._busy >= self.slots and self._waiting >= self.max_queue:
                raise ResourceExhausted(f"request queue is full ({self.max_queue} waiting); retry later")
            self._waiting += 1
            try:
                while self._busy >= self.slots:
                    self._cond.wait(POLL_S)
                    if should_stop():
                        raise Cancelled("request cancelled while queued")
            finally:
                self._waiting -= 1
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify()
