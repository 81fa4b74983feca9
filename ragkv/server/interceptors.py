"""Server interceptors: request ids + JSON logs + RPC metrics, bearer-token auth, error mapping.

Installed outermost first: RequestLogInterceptor, AuthInterceptor (when a token is
set), ErrorInterceptor. Only methods of the ragkv.v1 service need a token; the
standard health and reflection services stay open for probes and tooling.
"""

from __future__ import annotations

import contextvars
import hmac
import logging
import time
import uuid
from typing import Callable

import grpc
from google.protobuf import descriptor_pool

from ragkv.errors import RagKVServerError
from ragkv.server.wire import invalid_utf8_field
from workers.modes import PREFILL_MODES

log = logging.getLogger("ragkv.server")
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

PROTECTED_PREFIX = "/ragkv.v1."
REQUEST_ID_KEY = "x-request-id"


def _method_name(full: str) -> str:
    return full.rsplit("/", 1)[-1]


def _wrap(handler: grpc.RpcMethodHandler, unary: Callable, streaming: Callable) -> grpc.RpcMethodHandler:
    """Replace the behaviour of a unary-request handler: `unary(behavior)` / `streaming(behavior)` return
    the new one. Stream-request handlers (reflection) are returned as they are."""
    if handler.request_streaming:
        return handler
    if handler.response_streaming:
        return handler._replace(unary_stream=streaming(handler.unary_stream))
    return handler._replace(unary_unary=unary(handler.unary_unary))


def _aborting(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that fails every call without parsing the request."""

    def unary(request, context):
        context.abort(code, details)

    def streaming(request, context):
        context.abort(code, details)
        yield  # pragma: no cover - makes this a generator

    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, response_serializer=handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(unary, response_serializer=handler.response_serializer)


def _mode_label(request) -> str:
    mode = getattr(request, "mode", "") or "blend"
    return mode if mode in PREFILL_MODES else "invalid"  # bounded label values


def _final_code(context) -> grpc.StatusCode:
    code = context.code()
    if code is not None:
        return code
    if not context.is_active():
        remaining = context.time_remaining()
        return grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0 else grpc.StatusCode.CANCELLED
    return grpc.StatusCode.OK


class RequestLogInterceptor(grpc.ServerInterceptor):
    """Gives every RPC a request id (the caller's `x-request-id` or a fresh one, echoed in the
    initial metadata), logs one JSON line per RPC and counts it in `metrics` (may be None)."""

    def __init__(self, metrics=None):
        self.metrics = metrics

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        incoming = dict(details.invocation_metadata or ()).get(REQUEST_ID_KEY)
        rid = incoming[:64] if isinstance(incoming, str) and incoming else uuid.uuid4().hex[:16]

        def begin(context):
            token = request_id.set(rid)
            context.send_initial_metadata(((REQUEST_ID_KEY, rid),))
            return token, time.perf_counter()

        def end(request, context, started, error):
            code = _final_code(context)
            if error is not None and code is grpc.StatusCode.OK:
                code = grpc.StatusCode.UNKNOWN
            elapsed = time.perf_counter() - started
            mode = _mode_label(request) if _method_name(method).startswith("Generate") else ""
            log.info("rpc", extra={"fields": {"method": method, "code": code.name, "mode": mode or None,
                                              "duration_ms": round(elapsed * 1e3, 2), "peer": context.peer()}})
            if self.metrics is not None:
                self.metrics.observe_rpc(_method_name(method), mode, code.name, elapsed)

        def unary(behavior):
            def wrapped(request, context):
                token, started = begin(context)
                error = None
                try:
                    return behavior(request, context)
                except BaseException as e:
                    error = e
                    raise
                finally:
                    end(request, context, started, error)
                    request_id.reset(token)
            return wrapped

        def streaming(behavior):
            def wrapped(request, context):
                token, started = begin(context)
                error = None
                try:
                    yield from behavior(request, context)
                except BaseException as e:
                    error = e
                    raise
                finally:
                    end(request, context, started, None if isinstance(error, GeneratorExit) else error)
                    try:
                        request_id.reset(token)
                    except ValueError:  # resumed in another context (generator closed elsewhere)
                        pass
            return wrapped

        return _wrap(handler, unary, streaming)


class AuthInterceptor(grpc.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on ragkv.v1 methods (constant-time comparison)."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("empty token")
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or not details.method.startswith(PROTECTED_PREFIX):
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization")
        if given is None:
            return _aborting(handler, grpc.StatusCode.UNAUTHENTICATED, "missing authorization: Bearer <token> metadata")
        if isinstance(given, str):
            given = given.encode()
        if not hmac.compare_digest(given, self._expected):
            return _aborting(handler, grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")
        return handler


class _Undecodable:
    """Stands in for a request that protobuf could not parse."""

    def __init__(self, message: str):
        self.message = message


def _tolerant(deserializer, full_method: str):
    try:
        descriptor = descriptor_pool.Default().FindMethodByName(full_method.lstrip("/").replace("/", ".")).input_type
    except KeyError:
        descriptor = None

    def deserialize(data: bytes):
        try:
            return deserializer(data)
        except Exception:
            field = invalid_utf8_field(descriptor, data) if descriptor is not None else None
            if field is not None:
                return _Undecodable(f"{field}: invalid UTF-8")
            name = descriptor.full_name if descriptor is not None else "request"
            return _Undecodable(f"request: not a valid {name} message")

    return deserialize


class ErrorInterceptor(grpc.ServerInterceptor):
    """Maps ragkv.errors.* to their status codes and anything unexpected to INTERNAL with a generic
    message (logged with its traceback; the server keeps serving). An undecodable request (e.g.
    invalid UTF-8 in a string field) becomes INVALID_ARGUMENT naming the field."""

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        if handler.request_deserializer is not None:
            handler = handler._replace(request_deserializer=_tolerant(handler.request_deserializer, details.method))

        def fail(context, e: BaseException):
            if context.code() not in (None, grpc.StatusCode.OK):
                raise e  # already aborted on purpose (context.abort)
            if isinstance(e, RagKVServerError):
                context.abort(getattr(grpc.StatusCode, e.code_name, grpc.StatusCode.INTERNAL), str(e))
            log.error("unexpected error", exc_info=e, extra={"fields": {"method": details.method}})
            context.abort(grpc.StatusCode.INTERNAL, f"internal error (request id {request_id.get()})")

        def check(request, context):
            if isinstance(request, _Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)

        def unary(behavior):
            def wrapped(request, context):
                check(request, context)
                try:
                    return behavior(request, context)
                except Exception as e:
                    fail(context, e)
            return wrapped

        def streaming(behavior):
            def wrapped(request, context):
                check(request, context)
                try:
                    yield from behavior(request, context)
                except Exception as e:
                    fail(context, e)
            return wrapped

        return _wrap(handler, unary, streaming)
