"""Byte stores for blocks, picked by URL scheme; MemoryTier wraps any of them."""

from kvstore.backends.base import Backend, BackendError, BackendUnavailable, LRUIndex, StoreFullError
from kvstore.backends.memory import MemoryBackend, MemoryTier
from kvstore.backends.registry import BACKENDS, open_backend, register_backend

__all__ = ["BACKENDS", "Backend", "BackendError", "BackendUnavailable", "LRUIndex", "MemoryBackend", "MemoryTier",
           "StoreFullError", "open_backend", "register_backend"]
