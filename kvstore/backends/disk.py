"""Disk backend (`disk:PATH`): one file per block, sharded by key prefix.

    PATH/ab/abcdef....blk     a block (only ever appears complete, via os.replace)
    PATH/ab/abcdef....pin     an empty marker: the block is pinned (survives restarts)
    PATH/ab/.abcdef....*.tmp  a write in progress; removed when the store is opened

A write goes to a temp file in the same directory, is fsynced, then renamed
over the final name, so a crash at any point leaves either the old block, the
new block, or no block -- never a readable partial one. The LRU order lives in
memory and is rebuilt from file mtimes on open; gets bump the mtime.
Several processes may share a directory, but each keeps its own byte count.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

from kvstore.backends.base import Backend, BackendUnavailable, LRUIndex, check_key
from kvstore.backends.registry import register_backend
from kvstore.stats import BackendStats

BLOCK_SUFFIX = ".blk"
PIN_SUFFIX = ".pin"
# The LRU order lives in memory; file mtimes only rebuild it after a restart. Touch a file at
# most this often (like relatime): on some filesystems an mtime change drops the file's page
# cache, which made every hit a real read.
MTIME_REFRESH_S = 60.0


def _read_file(path: str) -> bytes:
    """The whole file, via the fd: no buffered-reader objects (a hit is a handful of syscalls)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size) if size else b""
        if len(data) < size:  # a short read: gather the rest (blocks are never rewritten in place)
            parts = [data]
            got = len(data)
            while got < size:
                part = os.read(fd, size - got)
                if not part:
                    break
                parts.append(part)
                got += len(part)
            data = b"".join(parts)
        return data
    finally:
        os.close(fd)


@register_backend("disk")
class DiskBackend(Backend):
    scheme = "disk"

    def __init__(self, root: str | os.PathLike, budget_bytes: int | None = None, fsync: bool = True):
        self.root = Path(root)
        self._root = str(self.root) + os.sep  # hot path: str joins, not Path objects
        self.fsync = fsync
        self._lru = LRUIndex(budget_bytes)
        self._touched: dict[str, float] = {}  # key -> monotonic time of its last mtime refresh
        self.hits = self.misses = 0
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._scan()
        except OSError as e:
            raise BackendUnavailable(f"disk store {self.root}: {e}") from None

    @classmethod
    def from_url(cls, url: str, budget_bytes: int | None = None) -> "DiskBackend":
        path = url.split(":", 1)[1]
        if path.startswith("//"):  # disk:///abs/path
            path = path[2:]
        if not path:
            raise ValueError("disk store URL needs a path: disk:PATH")
        return cls(os.path.expanduser(path), budget_bytes)

    def _scan(self) -> None:
        """Rebuild the LRU (oldest mtime first) and pins from the files; clear crashed temp files."""
        found: list[tuple[float, str, int]] = []
        pins: list[str] = []
        for shard in self.root.iterdir():
            if not shard.is_dir():
                continue
            for entry in os.scandir(shard):
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    os.unlink(entry.path)
                elif entry.name.endswith(BLOCK_SUFFIX):
                    st = entry.stat()
                    found.append((st.st_mtime, entry.name[: -len(BLOCK_SUFFIX)], st.st_size))
                elif entry.name.endswith(PIN_SUFFIX):
                    pins.append(entry.name[: -len(PIN_SUFFIX)])
        for _, key, size in sorted(found):
            self._lru.add(key, size)
        self._lru.pinned.update(k for k in pins if k in self._lru)

    def _path(self, key: str, suffix: str = BLOCK_SUFFIX) -> Path:
        return Path(self._file(key, suffix))

    def _file(self, key: str, suffix: str = BLOCK_SUFFIX) -> str:
        check_key(key)
        return self._root + key[:2] + os.sep + key + suffix

    def get(self, key: str) -> bytes | None:
        path = self._file(key)
        try:
            data = _read_file(path)
            now = time.monotonic()
            if now - self._touched.get(key, -MTIME_REFRESH_S) >= MTIME_REFRESH_S:
                os.utime(path)  # the access time the LRU is rebuilt from
                self._touched[key] = now
        except FileNotFoundError:
            with self._lru.lock:
                self._lru.remove(key)
                self.misses += 1
            return None
        except OSError as e:
            raise BackendUnavailable(f"disk store read failed: {e}") from None
        with self._lru.lock:
            self.hits += 1
            if key in self._lru:
                self._lru.touch(key)
            else:  # written by another process sharing the directory
                self._lru.add(key, len(data))
        return data

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._lru.lock:
            victims = self._lru.victims_for(key, len(data))
            for victim in victims:
                self._remove_files(victim, keep_pin=False)
                self._lru.remove(victim)
                self._lru.evictions += 1
            try:
                self._write_atomic(path, data)
            except OSError as e:
                raise BackendUnavailable(f"disk store write failed: {e}") from None
            pinned = key in self._lru.pinned
            self._lru.add(key, len(data))
            if pinned:
                self._lru.pinned.add(key)

    def _write_atomic(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.stem + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def _remove_files(self, key: str, keep_pin: bool) -> bool:
        self._touched.pop(key, None)
        removed = False
        for suffix in (BLOCK_SUFFIX,) if keep_pin else (BLOCK_SUFFIX, PIN_SUFFIX):
            try:
                os.unlink(self._path(key, suffix))
                removed = removed or suffix == BLOCK_SUFFIX
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise BackendUnavailable(f"disk store delete failed: {e}") from None
        return removed

    def delete(self, key: str) -> bool:
        with self._lru.lock:
            removed = self._remove_files(key, keep_pin=False)
            self._lru.remove(key)
            return removed

    def contains(self, key: str) -> bool:
        return os.path.exists(self._file(key))

    def pin(self, key: str) -> bool:
        with self._lru.lock:
            if not self.contains(key):
                return False
            if key not in self._lru:
                self._lru.add(key, self._path(key).stat().st_size)
            self._path(key, PIN_SUFFIX).touch()
            self._lru.pinned.add(key)
            return True

    def unpin(self, key: str) -> bool:
        with self._lru.lock:
            self._lru.pinned.discard(key)
            try:
                os.unlink(self._path(key, PIN_SUFFIX))
                return True
            except FileNotFoundError:
                return False

    def keys(self) -> Iterator[str]:
        with self._lru.lock:
            return iter(list(self._lru.sizes))

    def stats(self) -> dict:
        with self._lru.lock:
            return BackendStats("disk", **self._lru.counts(), hits=self.hits, misses=self.misses)

    def __repr__(self) -> str:
        return f"DiskBackend({str(self.root)!r}, budget_bytes={self._lru.budget})"
