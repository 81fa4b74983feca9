"""The `ragkv.plugins` entry point: registers research's codecs and selection methods into ragkv."""

from __future__ import annotations

import importlib

MODULES = ("ragkv_research.codecs", "ragkv_research.selection", "ragkv_research.modes")  # each registers its names when imported


def register() -> None:
    """Idempotent: a module registers once, when first imported."""
    for name in MODULES:
        importlib.import_module(name)
