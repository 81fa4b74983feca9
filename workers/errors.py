"""Domain errors: raised where requests are checked and served (workers), mapped to gRPC status codes at the
edge (ragkv.server.interceptors reads `code_name`). `ragkv.errors` re-exports them."""

from __future__ import annotations


class RagKVServerError(Exception):
    """Base class: every error the engine raises on purpose."""

    code_name = "INTERNAL"


class InvalidArgument(RagKVServerError):
    code_name = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class NotFound(RagKVServerError):
    code_name = "NOT_FOUND"


class Unavailable(RagKVServerError):
    code_name = "UNAVAILABLE"


class ResourceExhausted(RagKVServerError):
    code_name = "RESOURCE_EXHAUSTED"


class Cancelled(RagKVServerError):
    code_name = "CANCELLED"
