"""Session-wide fixtures: one loaded model, one real redis-server, temp cache dirs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session", autouse=True)
def _ragkv_cache_dir(tmp_path_factory) -> Path:
    """Converted-model cache shared by the session (and kept across sessions when RAGKV_CACHE_DIR is set)."""
    if "RAGKV_CACHE_DIR" not in os.environ:
        os.environ["RAGKV_CACHE_DIR"] = str(Path.home() / ".cache" / "ragkv")
    return Path(os.environ["RAGKV_CACHE_DIR"])


@pytest.fixture(scope="session")
def runner():
    """The real default model, loaded once per test session."""
    from workers.runner import ModelRunner

    return ModelRunner.load("default")


class RedisServer:
    """A real redis-server on a free loopback port, with its own data dir."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server not installed: run `make setup`")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """A clean database on the session's redis-server."""
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    return redis_server.url
