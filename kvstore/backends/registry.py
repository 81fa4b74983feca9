"""Backends by URL scheme: `disk:PATH`, `redis://` / `rediss://`, `memory:`.

Modules are imported lazily so `import kvstore` does not pull in redis-py.
"""

from __future__ import annotations

import importlib

from kvstore.backends.base import Backend

BACKENDS: dict[str, type[Backend]] = {}
_MODULES = {"disk": "kvstore.backends.disk", "redis": "kvstore.backends.redis_backend",
            "rediss": "kvstore.backends.redis_backend", "memory": "kvstore.backends.memory"}


def register_backend(*schemes: str):
    def wrap(cls: type[Backend]) -> type[Backend]:
        for scheme in schemes:
            BACKENDS[scheme] = cls
        return cls
    return wrap


def open_backend(url: str, budget_bytes: int | None = None) -> Backend:
    scheme = url.split(":", 1)[0].lower()
    if scheme not in _MODULES:
        raise ValueError(f"unknown store URL scheme {scheme!r}: use disk:PATH, redis://HOST:PORT/DB or memory:")
    importlib.import_module(_MODULES[scheme])
    return BACKENDS[scheme].from_url(url, budget_bytes=budget_bytes)
