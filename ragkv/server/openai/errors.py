"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, never a stack trace.

The engine's domain errors (workers/errors.py) map to HTTP statuses here, as the gRPC interceptor maps
them to status codes: InvalidArgument -> 400 naming its field in `param`, NotFound -> 404,
ResourceExhausted -> 429 (the admission queue is full), Unavailable / Cancelled -> 503.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from ragkv.errors import Cancelled, InvalidArgument, NotFound, RagKVServerError, ResourceExhausted, Unavailable

STATUS_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                500: "server_error", 503: "service_unavailable"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": STATUS_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self, headers: dict | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}" if param else message, param, code)


def from_domain(e: RagKVServerError) -> ApiError:
    """The domain error's HTTP status; `param` names the field of a bad argument."""
    message = str(e)
    if isinstance(e, InvalidArgument):  # the engine's field name -> the body's, in `param` and the message
        param = api_param(e.field)
        return ApiError(400, param + message[len(e.field):], param, "invalid_value")
    if isinstance(e, NotFound):
        if message.startswith("chunks["):  # a document given by an id nothing is stored under
            message = "documents" + message[len("chunks"):]
            return ApiError(404, message, message.split(":", 1)[0], "not_found")
        return ApiError(404, message, None, "not_found")
    if isinstance(e, ResourceExhausted):
        return ApiError(429, message, None, "queue_full")
    if isinstance(e, (Unavailable, Cancelled)):
        return ApiError(503, message, None, "unavailable")
    return ApiError(500, "internal error", None, "internal_error")


# engine field names -> the request's (the gRPC names where the HTTP body names the setting differently)
PARAM_NAMES = {"max_new_tokens": "max_tokens", "mode": "ragkv.mode", "recompute_ratio": "ragkv.recompute_ratio",
               "namespace": "ragkv.namespace", "compression": "ragkv.compression"}


def api_param(field: str) -> str:
    head, dot, rest = field.partition(".")
    if head == "compression":
        return "ragkv." + field
    if head.startswith("chunks["):
        return "documents" + head[len("chunks"):] + dot + rest
    return PARAM_NAMES.get(field, field)
