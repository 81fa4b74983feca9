"""One OpenMP pool at a time: a thread done with model work hands its idle OpenMP workers back.

The OpenMP runtime (libgomp, torch's) gives every thread that runs a parallel region its own pool of worker
threads, kept until that thread exits. Once the process holds more of them than it has CPUs, libgomp stops
spinning after a parallel region almost at once (its "throttled" wait, ~100 spins) and every region wakes
its workers through the kernel. The engine computes on its scheduler's thread, but the thread that built
it loaded the model and packed the decode weights, so on the 2-core box the process held two pools from
the first request on. Measured side by side (research/results/2026-12-07-eighth/): a blend@0.15 prefill
took 8-45% longer with two pools than with one (four runs), plain reuse 9-20%, a stored block's decode
3.6 against 6.1 ms; a full prefill, whose GEMMs are large, no longer. In `ragkv bench blend`: reuse
0.178 -> 0.126 s, blend at 0.15 / 0.3 / 0.5 9% / 15% / 10% less. (Scheduler.call's docstring has the same
effect on decode steps, which is why ingest's compute already ran on the scheduler's thread.)

`release_pool()` is OpenMP 5.0's omp_pause_resource_all(omp_pause_soft) on the runtime torch already
loaded: the calling thread's workers exit; its next parallel region, if any, starts a new pool (~70 us).
Two callers: the engine's building thread once it is built, and a scheduler whenever it runs out of work,
so a second engine in the process, or the caller's own model work, computes with the only pool. Model
work an engine's caller needs done goes to the scheduler's thread instead (Scheduler.call), as ingest's does.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

RUNTIMES = ("libgomp", "libomp", "libiomp5")  # GNU (torch's Linux wheels), LLVM, Intel
OMP_PAUSE_SOFT = 1
_FOUND: list = []  # omp_pause_resource_all, once found (a miss is looked for again: torch may load later)


def _pause():
    """omp_pause_resource_all of the OpenMP runtime this process has loaded, or None (none loaded yet, no such
    symbol, no /proc: not Linux). Never loads a runtime of its own (RTLD_NOLOAD)."""
    if _FOUND:
        return _FOUND[0]
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = dict.fromkeys(line.split()[-1] for line in maps.splitlines() if "/" in line)
    for path in paths:
        if not Path(path).name.startswith(RUNTIMES):
            continue
        try:
            pause = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        pause.argtypes, pause.restype = (ctypes.c_int,), ctypes.c_int
        _FOUND.append(pause)
        return pause
    return None


def release_pool() -> bool:
    """Let the calling thread's idle OpenMP workers exit (call it outside any parallel region, when the thread
    is done with model work). True when the runtime did; False where there is none to ask."""
    pause = _pause()
    return pause is not None and pause(OMP_PAUSE_SOFT) == 0
