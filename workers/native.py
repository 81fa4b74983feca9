"""workers' C kernels, built the way every C source of the project is (kvstore/native.py: compiled with the
machine's C compiler on first use, or prebuilt, and loaded through ctypes):

    workers/batching/avx2.c     the decode step (4/8-bit matrix-vector products, one call per layer)
    workers/row_attention.c     prefill attention of query rows over their own ranges of cached entries
    workers/rotary.c            RoPE in one pass: a stored chunk placed (drift, rotation, copy), a pass's q/k

They include workers/simd.h (shared AVX2 helpers). `python -m workers.native` prebuilds these and kvstore's
(the container images' build stage).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from kvstore import native as build_system
from kvstore.paths import native_dirs

SOURCES = (Path(__file__).parent / "batching" / "avx2.c", Path(__file__).with_name("row_attention.c"),
           Path(__file__).with_name("rotary.c"))
INCLUDE = Path(__file__).parent  # simd.h: the AVX2 helpers every source includes
HEADERS = build_system.headers(SOURCES[0], INCLUDE)


def load(source: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """(the compiled library, None), or (None, why not): built once per machine and source."""
    return build_system.load(source, INCLUDE)


def build(source: Path, directory: Path) -> Path:
    """Compile `source` into `directory` (gcc, or $CC) -> the library's path."""
    return build_system.build(source, directory, INCLUDE)


if __name__ == "__main__":  # prebuild every kernel into the environment (the container images' build stage)
    for src in SOURCES:
        print(build(src, native_dirs()[0]))
    for src in build_system.SOURCES:
        print(build_system.build(src, native_dirs()[0]))
