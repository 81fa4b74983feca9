"""release_pool: a thread's idle OpenMP workers exit (workers/openmp.py), so the engine's scheduler is the one
thread holding a pool."""

from __future__ import annotations

import os
import threading

import pytest
import torch

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
