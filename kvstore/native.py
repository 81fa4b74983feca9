"""The C kernels' build: a source compiled with the machine's C compiler on first use, loaded through ctypes.

One machinery for every C source of the project (kvstore's own and workers'; workers/native.py lists those and
prebuilds them all). A library is named by a hash of its source, the headers in its include folder and the
flags, and looked for in paths.native_dirs(): prebuilt in the environment (`python -m workers.native`, run by the
container images, whose runtime has no compiler), else built on first use into the cache directory, under a
temporary name and renamed, so processes building at once never load a half-written file. x86 with AVX2, FMA and
F16C only; elsewhere `load` says why not and the callers keep their torch paths.

    kvstore/kernels/dequant.c   a stored block's codes unpacked and scaled (the KIVI layout's group quantization)
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

from kvstore.paths import native_dirs

FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c11")
SOURCES = (Path(__file__).parent / "kernels" / "dequant.c",)


@functools.cache
def load(source: Path, include: Path | None = None) -> tuple[ctypes.CDLL | None, str | None]:
    """(the compiled library, None), or (None, why not): built once per machine and source. `include`: the folder
    of the headers it includes (default: its own)."""
    if not torch.backends.cpu.get_cpu_capability().startswith(("AVX2", "AVX512")):
        return None, f"the CPU has no AVX2 (torch reports {torch.backends.cpu.get_cpu_capability()})"
    name = library_name(source, include)
    path = next((d / name for d in native_dirs() if (d / name).exists()), None)
    try:
        if path is None:
            path = build(source, native_dirs()[-1], include)
        return ctypes.CDLL(str(path)), None
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"building {source.name} failed: {str(exc).strip()[:300]}"


def headers(source: Path, include: Path | None = None) -> tuple[Path, ...]:
    """The headers a source may include: every .h in its include folder."""
    return tuple(sorted((include or source.parent).glob("*.h")))


def library_name(source: Path, include: Path | None = None) -> str:
    text = source.read_bytes() + b"".join(h.read_bytes() for h in headers(source, include))
    digest = hashlib.sha256(text + " ".join(FLAGS).encode()).hexdigest()[:16]
    return f"ragkv-{source.stem.replace('_', '-')}-{digest}.so"


def build(source: Path, directory: Path, include: Path | None = None) -> Path:
    """Compile `source` into `directory` (gcc, or $CC) -> the library's path."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc or $CC)")
    path = directory / library_name(source, include)
    directory.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, f"-I{include or source.parent}", str(source), "-o", partial, "-lm"],
                       check=True, capture_output=True, text=True, timeout=120)
        os.replace(partial, path)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{compiler} exited with {exc.returncode}: {(exc.stderr or '').strip()[-300:]}") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path
