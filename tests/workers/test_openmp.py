"""release_pool: a thread's idle OpenMP workers exit (workers/openmp.py), so the thread computing holds the
process's only pool: the engine's building thread releases its own, an idle scheduler its own."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from workers.batching.scheduler import BatchConfig, Scheduler
from workers.openmp import release_pool


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or torch.get_num_threads() < 2,
                    reason="needs Linux and two OpenMP threads")
def test_a_thread_hands_its_openmp_workers_back():
    counts = {}

    def work() -> None:  # a fresh thread: no pool until its first parallel region
        before = _threads()
        a = torch.randn(512, 512)
        a @ a  # a parallel region: this thread's pool starts its workers
        counts["pool"] = _threads() - before
        counts["released"] = release_pool()
        counts["after"] = _threads() - before
        a @ a  # the next region starts a new pool, and gets the same answer
        counts["again"] = _threads() - before

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert counts["pool"] >= 1
    assert counts["released"] is True
    assert counts["after"] == 0
    assert counts["again"] == counts["pool"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or torch.get_num_threads() < 2,
                    reason="needs Linux and two OpenMP threads")
def test_an_idle_scheduler_hands_its_openmp_workers_back():
    """A second engine, or the caller, computing while this scheduler idles gets the process's only pool."""
    scheduler = Scheduler(BatchConfig(), prefill=lambda seq: None, decode=lambda seqs: None)
    try:
        scheduler.call(lambda: None)  # its thread runs, then idles
        base = _settled(lambda n: True)
        a = torch.randn(512, 512)
        during = scheduler.call(lambda: (a @ a, _threads())[1])  # a parallel region on the scheduler's thread
        assert during > base
        assert _settled(lambda n: n == base) == base  # idle again: its workers have exited
    finally:
        scheduler.close()


def _settled(done, timeout_s: float = 5.0) -> int:
    """The thread count once `done(count)` holds and it stays put for a moment (bounded by timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = _threads()
        time.sleep(0.2)
        if (done(count) and _threads() == count) or time.monotonic() > deadline:
            return _threads()
