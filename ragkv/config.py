"""Server configuration: a frozen dataclass built in layers (defaults -> environment -> CLI flags).

Nothing here is written back at run time; derived values (the engine config, the
gRPC options) are computed from it where they are used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Mapping

MiB = 1 << 20


def default_cache_dir() -> Path:
    return Path(os.environ.get("RAGKV_CACHE_DIR", Path.home() / ".cache" / "ragkv"))


def default_store() -> str:
    return f"disk:{default_cache_dir() / 'blocks'}"


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    model: str = "default"
    store: str = ""  # empty: disk under the cache dir (see store_url)
    codec: str = "kivi2"
    workers: str = "inproc"  # inproc | ray | auto | ray://ADDRESS
    device: str | None = None
    memory_budget_bytes: int | None = None  # in-memory tier over the store; None: the engine's default
    token: str | None = None  # bearer token required on every RagKV call; None: no auth
    tls_cert: str | None = None
    tls_key: str | None = None
    metrics_port: int | None = None
    max_queue: int = 64  # requests allowed to wait for the engine; one more -> RESOURCE_EXHAUSTED
    max_message_bytes: int = 64 * MiB
    grace_s: float = 30.0  # SIGTERM: how long in-flight requests may take to finish
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port out of range: {self.port}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.codec not in ("fp16", "int8", "int4", "kivi2"):
            raise ValueError(f"unknown codec {self.codec!r}")
        if not (self.workers in ("inproc", "ray", "auto") or self.workers.startswith("ray://")):
            raise ValueError(f"--workers must be inproc, ray, auto or ray://ADDRESS, got {self.workers!r}")

    @property
    def store_url(self) -> str:
        return self.store or default_store()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ServeConfig":
        """Defaults overlaid with RAGKV_<FIELD> variables (e.g. RAGKV_TOKEN, RAGKV_MAX_QUEUE)."""
        env = os.environ if env is None else env
        values = {}
        for f in fields(cls):
            raw = env.get(f"RAGKV_{f.name.upper()}")
            if raw is not None:
                values[f.name] = _parse(f.type, raw)
        return cls(**values)

    def with_overrides(self, **overrides) -> "ServeConfig":
        """A copy with every override that is not None (CLI flags left unset keep the lower layer)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _parse(type_name: str, raw: str):
    if "int" in type_name:
        return int(raw)
    if "float" in type_name:
        return float(raw)
    return raw
