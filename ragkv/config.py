"""Server configuration: a frozen dataclass built in layers (defaults -> environment -> CLI flags).

ServeConfig holds the server's own settings and the engine's EngineConfig (workers/engine.py) as
it is: the engine's defaults are written once, there. The engine settings read through
(`config.codec` is `config.engine.codec`), and their flags / RAGKV_* variables keep their flat
names (--codec, RAGKV_CODEC). Nothing here is written back at run time; derived values (the gRPC
options) are computed from it where they are used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Mapping

from kvstore.codecs import CODECS
from workers.batching.scheduler import BatchConfig
from workers.chunk_forms import CHUNK_FORMS
from workers.engine import EngineConfig
from workers.paths import default_store_url
from workers.projections import check_prefill_kernel

MiB = 1 << 20
BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
# EngineConfig fields a flag or a RAGKV_* variable sets (the others are the engine's own business)
ENGINE_FIELDS = ("model", "store", "codec", "workers", "device", "memory_budget_bytes", "chunk_form", "prefill_kernel",
                 "retain_memory")
BATCH_FIELDS = ("max_batch", "max_batch_tokens", "decode_kernel")  # EngineConfig.batch (BatchConfig)
WORKERS_FORMS = ("inproc", "ray", "auto")  # or ray://ADDRESS


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    engine: EngineConfig = field(default_factory=EngineConfig)  # model, store, codec, workers, device, ...
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
            raise ValueError(f"--port: out of range: {self.port}")
        if self.max_queue < 0:
            raise ValueError(f"--max-queue: must be >= 0, got {self.max_queue}")
        if self.engine.codec not in CODECS:
            raise ValueError(f"--codec: unknown codec {self.engine.codec!r}; known: {', '.join(sorted(CODECS))}")
        if self.engine.chunk_form not in CHUNK_FORMS:
            raise ValueError(f"--chunk-form: unknown chunk form {self.engine.chunk_form!r}; "
                             f"known: {', '.join(CHUNK_FORMS)}")
        check_prefill_kernel(self.engine.prefill_kernel)  # ValueError names --prefill-kernel
        workers = self.engine.workers
        if not (workers in WORKERS_FORMS or workers.startswith("ray://")):
            raise ValueError(f"--workers must be inproc, ray, auto or ray://ADDRESS, got {workers!r}")

    def __getattr__(self, name: str):
        """The engine settings read through: config.codec is config.engine.codec."""
        if name in ENGINE_FIELDS:
            return getattr(self.engine, name)
        if name in BATCH_FIELDS:
            return getattr(self.engine.batch, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def store_url(self) -> str:
        return self.engine.store or default_store_url()

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
        settable = [f for f in fields(cls) if f.name != "engine"] + \
            [f for f in fields(EngineConfig) if f.name in ENGINE_FIELDS] + \
            [f for f in fields(BatchConfig) if f.name in BATCH_FIELDS]
        values = {}
        for f in settable:
            name = f"RAGKV_{f.name.upper()}"
            raw = env.get(name)
            if raw is not None:
                try:
                    values[f.name] = _parse(f.type, raw)
                except ValueError as e:
                    raise ValueError(f"{name}: {e}") from None
        return cls().with_overrides(**values)

    def with_overrides(self, **overrides) -> "ServeConfig":
        """A copy with every override that is not None (CLI flags left unset keep the lower layer);
        engine settings (ENGINE_FIELDS) go into the EngineConfig."""
        given = {k: v for k, v in overrides.items() if v is not None}
        engine = {k: given.pop(k) for k in ENGINE_FIELDS if k in given}
        batch = {k: given.pop(k) for k in BATCH_FIELDS if k in given}
        if batch:
            engine["batch"] = replace(self.engine.batch, **batch)
        return replace(self, engine=replace(self.engine, **engine), **given)


def _parse(type_name: str, raw: str):
    if "bool" in type_name:
        word = raw.strip().lower()
        if word not in BOOLEANS:
            raise ValueError(f"expected one of {', '.join(BOOLEANS)}, got {raw!r}")
        return BOOLEANS[word]
    if "int" in type_name:
        return int(raw)
    if "float" in type_name:
        return float(raw)
    return raw
