"""Plug-ins: installed packages that add names to ragkv's registries (research/ is one, `ragkv_research`).

A plug-in declares an entry point in the group `ragkv.plugins` whose object is a function of no
arguments that registers its names (codecs, selection methods, ...). `load_plugins()` calls each one
once per process, the first time a registry is asked for a name it lacks (kvstore/registry.py
`Registry`); nothing is scanned at import time, and the product never imports a plug-in by name.
"""

from __future__ import annotations

import threading
from importlib.metadata import entry_points

GROUP = "ragkv.plugins"
HINT = f"names moved to research/ need it installed (pip install -e research/: entry points {GROUP!r})"
_lock = threading.Lock()
_loaded: list[str] | None = None  # entry point names, once loaded


def load_plugins() -> bool:
    """Call every `ragkv.plugins` entry point once; True when this call registered anything new."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return False
        _loaded = []
        for point in entry_points(group=GROUP):
            point.load()()
            _loaded.append(point.name)
        return bool(_loaded)
