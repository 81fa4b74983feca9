"""Server configuration: a frozen dataclass built in layers (defaults -> file -> environment -> CLI flags).

ServeConfig holds the server's own settings and the engine's EngineConfig (workers/engine.py) as
it is: the engine's defaults are written once, there. The engine settings read through
(`config.codec` is `config.engine.codec`), and their flags / RAGKV_* variables keep their flat
names (--codec, RAGKV_CODEC, `codec = "int8"` in a --config file). Nothing here is written back at run
time; derived values (the gRPC options) are computed from it where they are used.

The config file (`ragkv serve --config FILE`, TOML) holds any setting by its field name, flat:

    max_queue = 128
    grace_s = 10.0
    retain_memory = false
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import Mapping

from kvstore.codecs import CODECS
from kvstore.plugins import HINT
from workers.batching.scheduler import BatchConfig
from workers.blend import BlendConfig
from workers.chunk_forms import CHUNK_FORMS
from workers.engine import EngineConfig, adaptive_controller
from workers.paths import default_store_url
from workers.projections import check_prefill_kernel

MiB = 1 << 20
BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
# EngineConfig fields a flag or a RAGKV_* variable sets (the others are the engine's own business)
ENGINE_FIELDS = ("model", "store", "codec", "workers", "device", "memory_budget_bytes", "chunk_form", "prefill_kernel",
                 "retain_memory", "sequence_cache", "shadow_sample", "decoded_budget_bytes", "prompt_template",
                 "adaptive_target", "adaptive_ratios", "adaptive_window")
BATCH_FIELDS = ("max_batch", "max_batch_tokens", "decode_kernel")  # EngineConfig.batch (BatchConfig)
# EngineConfig.blend (BlendConfig): the ratio of requests that give none, and the ratio served exactly from
BLEND_FIELDS = ("recompute_ratio", "exact_from")
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
    http_port: int | None = None  # the OpenAI-compatible HTTP API (ragkv/server/openai); None: off
    max_queue: int = 64  # requests allowed to wait for the engine; one more -> RESOURCE_EXHAUSTED
    max_message_bytes: int = 64 * MiB
    grace_s: float = 30.0  # SIGTERM: how long in-flight requests may take to finish
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if not 0.0 <= self.engine.shadow_sample <= 1.0:
            raise ValueError(f"shadow_sample: must be in [0, 1], got {self.engine.shadow_sample}")
        adaptive_controller(self.engine)  # ValueError names the adaptive_* setting
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port: out of range: {self.port}")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ValueError(f"--http-port: out of range: {self.http_port}")
        if self.max_queue < 0:
            raise ValueError(f"--max-queue: must be >= 0, got {self.max_queue}")
        if self.engine.codec not in CODECS:
            raise ValueError(f"--codec: unknown codec {self.engine.codec!r}; known: {', '.join(sorted(CODECS))}; "
                             f"{HINT}")
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
        if name in BLEND_FIELDS:
            return getattr(self.engine.blend, name)
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
    def load(cls, path: str | None = None, env: Mapping[str, str] | None = None) -> "ServeConfig":
        """Defaults, then the TOML file at `path` (if any), then RAGKV_<FIELD> variables."""
        return (cls.from_file(path) if path else cls()).with_env(env)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ServeConfig":
        """Defaults overlaid with RAGKV_<FIELD> variables (e.g. RAGKV_TOKEN, RAGKV_MAX_QUEUE)."""
        return cls().with_env(env)

    @classmethod
    def from_file(cls, path: str) -> "ServeConfig":
        """Defaults overlaid with a TOML file's settings (flat keys, the field names); ValueError naming the
        file and the key on an unknown key or a value of the wrong type."""
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except OSError as e:
            raise ValueError(f"--config: cannot read {path}: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"--config: {path}: not TOML: {e}") from None
        types = settable()
        unknown = sorted(set(table) - set(types))
        if unknown:
            raise ValueError(f"--config: {path}: unknown setting {unknown[0]!r}; known: {', '.join(sorted(types))}")
        try:
            return cls().with_overrides(**{k: _typed(k, types[k], v) for k, v in table.items()})
        except (ValueError, TypeError) as e:
            raise ValueError(f"--config: {path}: {e}") from None

    def with_env(self, env: Mapping[str, str] | None = None) -> "ServeConfig":
        """This config overlaid with RAGKV_<FIELD> variables."""
        env = os.environ if env is None else env
        values = {}
        for name, type_name in settable().items():
            variable = f"RAGKV_{name.upper()}"
            raw = env.get(variable)
            if raw is not None:
                try:
                    values[name] = _parse(type_name, raw)
                except ValueError as e:
                    raise ValueError(f"{variable}: {e}") from None
        return self.with_overrides(**values)

    def with_overrides(self, **overrides) -> "ServeConfig":
        """A copy with every override that is not None (CLI flags left unset keep the lower layer);
        engine settings (ENGINE_FIELDS) go into the EngineConfig."""
        given = {k: v for k, v in overrides.items() if v is not None}
        engine = {k: given.pop(k) for k in ENGINE_FIELDS if k in given}
        batch = {k: given.pop(k) for k in BATCH_FIELDS if k in given}
        if batch:
            engine["batch"] = replace(self.engine.batch, **batch)
        blend = {k: given.pop(k) for k in BLEND_FIELDS if k in given}
        if blend:
            try:
                engine["blend"] = replace(self.engine.blend, **blend)
            except ValueError as e:
                flags = " / ".join("--" + k.replace("_", "-") for k in blend)
                raise ValueError(f"{flags}: {e}") from None
        return replace(self, engine=replace(self.engine, **engine), **given)


def settable() -> dict[str, str]:
    """Every setting a file, a RAGKV_* variable or a flag may set: field name -> its annotation."""
    own = [f for f in fields(ServeConfig) if f.name != "engine"]
    engine = [f for f in fields(EngineConfig) if f.name in ENGINE_FIELDS]
    batch = [f for f in fields(BatchConfig) if f.name in BATCH_FIELDS]
    blend = [f for f in fields(BlendConfig) if f.name in BLEND_FIELDS]
    return {f.name: str(f.type) for f in own + engine + batch + blend}


def _typed(name: str, type_name: str, value):
    """A TOML value checked against the field's annotation (an int is a float too; null is not TOML)."""
    wanted = [t for t in ("bool", "int", "float", "str") if t in type_name]
    ok = {"bool": isinstance(value, bool), "int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool), "str": isinstance(value, str)}
    if not any(ok[t] for t in wanted):
        raise ValueError(f"{name} must be {' or '.join(wanted)}, got {value!r}")
    return float(value) if wanted == ["float"] else value


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
