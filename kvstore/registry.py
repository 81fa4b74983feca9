"""Registries by name: one rule for every plug-in family (codecs, backends, policies, modes, kernels...).

A family keeps its own `dict[str, ...]`; these helpers add to it and refuse a name twice, so a
second registration is an error at import, never a silent replacement.
"""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def add_unique(table: dict, kind: str, name: str, entry) -> None:
    """table[name] = entry, or ValueError when `name` (a `kind`, for the message) is taken."""
    if name in table:
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
