"""Host memory: keep freed memory in the process instead of handing it back to the kernel.

A CPU prefill allocates and frees tens of megabytes per layer (activations; blend's fused cache is
about 50 MB for 2k tokens). glibc serves allocations over its mmap threshold with fresh mappings
and unmaps them on free, so every request touches new pages: a page fault and the kernel's zeroing
for every 4 KiB. Measured side by side in one process on the 2-core CPU box (research/blend.md, "Selection methods"), that
was about 20% of a 2k-token full prefill and of plain reuse's time. Raising the mmap and trim
thresholds keeps those pages for the next request, which is what preloading jemalloc or tcmalloc
does for PyTorch CPU serving. One arena, so the scheduler thread allocates from the main heap
(a thread arena's heaps are capped at 64 MiB and shrink on free).

The cost is that the process keeps about its peak heap: memory freed after a long prompt is reused
by the next request, not returned to the system. In an engine serving 8-chunk prompts (2k tokens)
in all modes, resident memory stayed at 2.06 GB against 1.87 GB with glibc's defaults (whose peak
was 2.09 GB). A heap that sees one large size over and over grows by about ten blocks of it before
the freed ones coalesce and are reused (tests/workers/test_allocator.py). `EngineConfig.retain_memory
=False` leaves glibc's defaults alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 1 << 30  # allocations up to 1 GiB come from the heap
TRIM_THRESHOLD = (1 << 31) - 1  # never trim the heap's top (an int: mallopt takes one)
ARENAS = 1


@lru_cache(maxsize=1)
def retain_freed_memory() -> bool:
    """Set the thresholds once per process; True when glibc took them (False elsewhere: musl, macOS).

    Call it before the threads that allocate are started: a thread keeps the arena it first used."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    settings = ((M_ARENA_MAX, ARENAS), (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return all(mallopt(param, value) == 1 for param, value in settings)
