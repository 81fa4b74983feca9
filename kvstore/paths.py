"""Where ragkv keeps its files: one cache directory (RAGKV_CACHE_DIR, default ~/.cache/ragkv).

Under it: models/ (the converted default model), blocks/ (the default disk store), calibration/,
native/ (the C kernels built on first use, kvstore/native.py; see native_dirs). workers/paths.py re-exports these.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("RAGKV_CACHE_DIR", Path.home() / ".cache" / "ragkv"))


def native_dirs() -> list[Path]:
    """Where the C kernels' compiled libraries are looked for, in order: prebuilt in the environment
    (`python -m workers.native`, as the container images do), then built on first use in the cache."""
    return [Path(sys.prefix) / "share" / "ragkv" / "native", cache_dir() / "native"]
