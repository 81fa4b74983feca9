"""A throwaway redis-server on a free loopback port, for tests and benchmarks.

    with RedisServer() as server:
        backend = open_backend(server.url)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """redis-server with its own data dir; started on enter, killed on exit.

    `persist=True` turns on an fsync-always append-only file, so data outlives a SIGKILL
    (`kill()`, then `start()` again on the same port); `password` sets requirepass.
    """

    def __init__(self, workdir: str | Path | None = None, port: int | None = None, password: str | None = None,
                 persist: bool = False):
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="ragkv-redis-")
        self.workdir = Path(workdir if workdir is not None else self._tmp.name)
        self.port = port or free_port()
        self.password = password
        self.persist = persist
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: run `make setup`")
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(self.workdir)]
        argv += ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        """SIGKILL, keeping the data dir: `start()` brings it back on the same port."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
