"""Where ragkv keeps its files: one cache directory (RAGKV_CACHE_DIR, default ~/.cache/ragkv).

Under it: models/ (the converted default model), blocks/ (the default disk store), calibration/,
native/ (the C kernels built on first use, kvstore/native.py; see native_dirs). cache_dir and native_dirs
live in kvstore/paths.py (the lowest layer's C kernels need them) and are re-exported here.
"""

from __future__ import annotations

from kvstore.paths import cache_dir, native_dirs  # noqa: F401  (kvstore's C kernels need them too)


def default_store_url() -> str:
    """The store when none is configured: a disk store under the cache directory."""
    return f"disk:{cache_dir() / 'blocks'}"
