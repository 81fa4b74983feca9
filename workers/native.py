"""The C kernels: each source is compiled with the machine's C compiler on first use and loaded through ctypes.

    workers/batching/avx2.c     the decode step (4/8-bit matrix-vector products, one call per layer)
    workers/row_attention.c     prefill attention of query rows over their own ranges of cached entries
    workers/rotary.c            RoPE in one pass: a stored chunk placed (drift, rotation, copy), a pass's q/k

The first two include workers/simd.h (shared AVX2 helpers). A library is named by a hash of its source, the header and
the flags and looked for in paths.native_dirs(): prebuilt in the environment (`python -m workers.native`, run
by the container images, whose runtime has no compiler), else built on first use into the cache directory,
under a temporary name and renamed, so processes building at once never load a half-written file. x86 with AVX2, FMA and F16C only; elsewhere `load` says why not and
the callers keep their torch paths.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from workers.paths import native_dirs

FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c11")
SOURCES = (Path(__file__).parent / "batching" / "avx2.c", Path(__file__).with_name("row_attention.c"),
           Path(__file__).with_name("rotary.c"))
INCLUDE = Path(__file__).parent  # simd.h: the AVX2 helpers every source includes
HEADERS = (INCLUDE / "simd.h",)


@functools.cache
def load(source: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """(the compiled library, None), or (None, why not): built once per machine and source."""
    if not torch.backends.cpu.get_cpu_capability().startswith(("AVX2", "AVX512")):
        return None, f"the CPU has no AVX2 (torch reports {torch.backends.cpu.get_cpu_capability()})"
    name = library_name(source)
    path = next((d / name for d in native_dirs() if (d / name).exists()), None)
    try:
        if path is None:
            path = build(source, native_dirs()[-1])
        return ctypes.CDLL(str(path)), None
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"building {source.name} failed: {str(exc).strip()[:300]}"


def library_name(source: Path) -> str:
    text = source.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    digest = hashlib.sha256(text + " ".join(FLAGS).encode()).hexdigest()[:16]
    return f"ragkv-{source.stem.replace('_', '-')}-{digest}.so"


def build(source: Path, directory: Path) -> Path:
    """Compile `source` into `directory` (gcc, or $CC) -> the library's path."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc or $CC)")
    path = directory / library_name(source)
    directory.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, f"-I{INCLUDE}", str(source), "-o", partial, "-lm"], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(partial, path)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{compiler} exited with {exc.returncode}: {(exc.stderr or '').strip()[-300:]}") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path


if __name__ == "__main__":  # prebuild every kernel into the environment (the container images' build stage)
    for src in SOURCES:
        print(build(src, native_dirs()[0]))
