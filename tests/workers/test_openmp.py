"""release_pool: a thread's idle OpenMP workers exit (workers/openmp.py), so the thread computing holds the
process's only pool: the engine's building thread releases its own, an idle scheduler its own.

Workers are counted by name, not as the process's thread count: a worker thread starts with its creator's
name (Linux copies it), and threads other tests left behind may exit at any moment. The parallel region is an
elementwise op (ATen's own OpenMP loop, two threads above 32,768 elements), not a matmul, whose BLAS may
choose one thread on its own (MKL counts physical cores)."""

from __future__ import annotations

import ctypes
import os
import threading
import time

import pytest
import torch

from workers.batching.scheduler import BatchConfig, Scheduler
from workers.openmp import release_pool

PR_SET_NAME = 15
needs_linux_and_two_threads = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task") or torch.get_num_threads() < 2, reason="needs Linux and two OpenMP threads")


def _name_this_thread(name: str) -> None:
    assert ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode(), 0, 0, 0) == 0


def _named(name: str) -> int:
    """How many of this process's threads are called `name`."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            count += open(f"/proc/self/task/{task}/comm").read().strip() == name
        except OSError:  # exited while we looked
            pass
    return count


def _parallel_region() -> None:
    torch.empty(1 << 22).exp_()


@needs_linux_and_two_threads
def test_a_thread_hands_its_openmp_workers_back():
    counts = {}

    def work() -> None:  # a fresh thread: no pool until its first parallel region
        _name_this_thread("ragkv-omp-a")
        counts["alone"] = _named("ragkv-omp-a")
        _parallel_region()  # this thread's pool starts its workers
        counts["pool"] = _named("ragkv-omp-a")
        counts["released"] = release_pool()
        counts["after"] = _named("ragkv-omp-a")
        _parallel_region()  # the next region starts a new pool, of the same size
        counts["again"] = _named("ragkv-omp-a")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert counts["alone"] == 1
    assert counts["pool"] >= 2
    assert counts["released"] is True
    assert counts["after"] == 1
    assert counts["again"] == counts["pool"]


@needs_linux_and_two_threads
def test_an_idle_scheduler_hands_its_openmp_workers_back():
    """A second engine, or the caller, computing while this scheduler idles gets the process's only pool."""
    scheduler = Scheduler(BatchConfig(), prefill=lambda seq: None, decode=lambda seqs: None)
    try:
        scheduler.call(lambda: _name_this_thread("ragkv-omp-s"))  # its thread runs, then idles
        assert _settled("ragkv-omp-s", 1) == 1
        during = scheduler.call(lambda: (_parallel_region(), _named("ragkv-omp-s"))[1])
        assert during >= 2  # the scheduler's thread and its workers
        assert _settled("ragkv-omp-s", 1) == 1  # idle again: its workers have exited
    finally:
        scheduler.close()


def _settled(name: str, want: int, timeout_s: float = 5.0) -> int:
    """How many threads are called `name` once that is `want` (or timeout_s has passed)."""
    deadline = time.monotonic() + timeout_s
    while _named(name) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return _named(name)
