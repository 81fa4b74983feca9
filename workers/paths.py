"""Where ragkv keeps its files: one cache directory (RAGKV_CACHE_DIR, default ~/.cache/ragkv).

Under it: models/ (the converted default model), blocks/ (the default disk store), calibration/,
native/ (the decode kernels built on first use, workers/batching/avx2.py).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("RAGKV_CACHE_DIR", Path.home() / ".cache" / "ragkv"))


def default_store_url() -> str:
    """The store when none is configured: a disk store under the cache directory."""
    return f"disk:{cache_dir() / 'blocks'}"
