"""Registries by name: one rule for every plug-in family (codecs, backends, policies, modes, kernels...).

A family keeps its own table, a `Registry` (a dict of name -> entry); these helpers add to it and
refuse a name twice, so a second registration is an error at import, never a silent replacement.
A lookup by name that misses loads the installed plug-ins once (kvstore/plugins.py) and looks again,
so names a plug-in registers (research/) work wherever the family is consulted by name.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from kvstore.plugins import load_plugins

T = TypeVar("T")


class Registry(dict):
    """name -> entry; `name in registry` and `registry[name]` load the plug-ins on a miss (once a process)."""

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or (load_plugins() and dict.__contains__(self, name))

    def __missing__(self, name):
        if load_plugins() and dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        raise KeyError(name)


def add_unique(table: dict, kind: str, name: str, entry) -> None:
    """table[name] = entry, or ValueError when `name` (a `kind`, for the message) is taken."""
    if dict.__contains__(table, name):  # what is registered already: no plug-in lookup
        raise ValueError(f"{kind} {name!r} registered twice")
    table[name] = entry


def registrar(table: dict, kind: str) -> Callable[[str], Callable[[T], T]]:
    """A decorator factory: `@registrar(TABLE, "chunk form")("lead")` adds the decorated object as is."""
    def named(name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            add_unique(table, kind, name, entry)
            return entry
        return add
    return named
