"""The engine's domain errors, re-exported for the application layer; they are defined (and raised) in
workers.errors and mapped to gRPC status codes by ragkv.server.interceptors."""

from workers.errors import Cancelled, InvalidArgument, NotFound, RagKVServerError, ResourceExhausted, Unavailable

__all__ = ["Cancelled", "InvalidArgument", "NotFound", "RagKVServerError", "ResourceExhausted", "Unavailable"]
