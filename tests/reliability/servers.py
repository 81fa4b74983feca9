"""Start `ragkv serve` subprocesses for the reliability tests (one torch thread each: the CPUs are shared)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from serving_helpers import ServerProcess


@contextmanager
def serving(workdir: Path, *extra: str, metrics: bool = False):
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        proc = ServerProcess(workdir, *extra, metrics=metrics).start()
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    try:
        yield proc
    finally:
        proc.kill()
