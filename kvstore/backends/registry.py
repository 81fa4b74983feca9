"""Backends by URL scheme: `disk:PATH`, `redis://` / `rediss://`, `redis+cluster://` / `rediss+cluster://`, `memory:`.

Modules are imported lazily so `import kvstore` does not pull in redis-py.
"""

from __future__ import annotations

import importlib

from kvstore.backends.base import Backend

BACKENDS: dict[str, type[Backend]] = {}
_MODULES = {"disk": "kvstore.backends.disk", "redis": "kvstore.backends.redis_backend",
            "rediss": "kvstore.backends.redis_backend", "memory": "kvstore.backends.memory",
            "redis+cluster": "kvstore.backends.redis_cluster", "rediss+cluster": "kvstore.backends.redis_cluster"}


def register_backend(*schemes: str):
    def wrap(cls: type[Backend]) -> type[Backend]:
        for scheme in schemes:
            BACKENDS[scheme] = cls
        return cls
    return wrap


def url_scheme(url: str) -> str:
    """The backend scheme of a store URL; ValueError when no backend serves it (nothing is opened)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme not in _MODULES:
        raise ValueError(f"unknown store URL scheme {scheme!r}: use disk:PATH, redis://HOST:PORT/DB, "
                         "redis+cluster://HOST:PORT[,HOST:PORT...] or memory:")
    return scheme


def open_backend(url: str, budget_bytes: int | None = None) -> Backend:
    scheme = url_scheme(url)
    importlib.import_module(_MODULES[scheme])
    return BACKENDS[scheme].from_url(url, budget_bytes=budget_bytes)
