"""Eviction tests run single-threaded: the bookkeeping is many tiny ops, and on 2 shared cores intra-op
threads mostly wait on each other (measured 0.14 ms vs 24 ms per op under load)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
