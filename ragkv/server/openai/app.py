"""The FastAPI app and its uvicorn server, run on a thread beside the gRPC server.

Routes: GET /v1/models, POST /v1/chat/completions, POST /v1/completions (bearer token when the server
has one), GET /health (open, for probes: 503 while draining), GET /metrics (open, Prometheus). A body
is read up to `max_body_bytes`, parsed as JSON and validated (schemas.py) before anything reaches the
engine: malformed, oversized or hostile bodies are 400s that touch nothing stored.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from ragkv.errors import RagKVServerError
from ragkv.server.admission import Admission
from ragkv.server.metrics import Metrics
from ragkv.server.openai import completions
from ragkv.server.openai.convert import Envelope, chat_request, check_model, completion_request
from ragkv.server.openai.errors import ApiError, bad_request, from_domain
from ragkv.server.openai.gateway import Gateway
from ragkv.server.openai.schemas import ChatCompletionBody, CompletionBody
from workers.protocol import EngineProtocol

log = logging.getLogger("ragkv.server")

MAX_BODY_BYTES = 8 << 20
REQUEST_ID = "x-request-id"
METHODS = {"/v1/chat/completions": "ChatCompletions", "/v1/completions": "Completions", "/v1/models": "Models"}


@dataclass(frozen=True)
class HttpSettings:
    models: tuple[str, ...]  # the names `model` may take (the first is listed first)
    token: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES


def create_app(engine: EngineProtocol, admission: Admission, metrics: Metrics, settings: HttpSettings) -> FastAPI:
    app = FastAPI(title="ragkv", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = Gateway(engine, admission)
    app.state.draining = False
    expected = f"Bearer {settings.token}".encode() if settings.token else None

    @app.middleware("http")
    async def edge(request: Request, call_next):
        """Request id, bearer token, one log line and the RPC metrics per request; errors in OpenAI's shape."""
        rid = (request.headers.get(REQUEST_ID) or uuid.uuid4().hex[:16])[:64]
        started, path = time.perf_counter(), request.url.path
        try:
            if path.startswith("/v1/"):
                check_token(request, expected)
                if app.state.draining:
                    raise ApiError(503, "the server is shutting down", None, "unavailable")
            response = await call_next(request)
        except ApiError as e:
            response = e.response()
        except RagKVServerError as e:
            response = from_domain(e).response()
        except Exception as e:  # logged with its traceback; the client sees a generic error
            log.error("unexpected error", exc_info=e, extra={"fields": {"path": path}})
            response = ApiError(500, f"internal error (request id {rid})", None, "internal_error").response()
        response.headers[REQUEST_ID] = rid
        elapsed = time.perf_counter() - started
        if path in METHODS:
            metrics.observe_rpc(METHODS[path], "", str(response.status_code), elapsed)
        log.info("http", extra={"fields": {"method": request.method, "path": path[:200], "status": response.status_code,
                                           "duration_ms": round(elapsed * 1e3, 2), "request_id": rid}})
        return response

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        return ApiError(e.status_code, str(e.detail), None, "not_found" if e.status_code == 404 else None).response()

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return e.response()

    @app.exception_handler(RagKVServerError)
    async def domain_error(request: Request, e: RagKVServerError):
        return from_domain(e).response()

    @app.get("/health")
    async def health():
        if app.state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "ragkv"}
                                           for m in settings.models]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await read_body(request, ChatCompletionBody, settings.max_body_bytes)
        check_model(body.model, settings.models)
        return await run(app.state.gateway, chat_request(body), Envelope(body.model, chat=True), body)

    @app.post("/v1/completions")
    async def complete(request: Request):
        body = await read_body(request, CompletionBody, settings.max_body_bytes)
        check_model(body.model, settings.models)
        return await run(app.state.gateway, completion_request(body), Envelope(body.model, chat=False), body)

    return app


async def run(gateway: Gateway, request, envelope: Envelope, body) -> Response:
    stops = body.stops()
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await completions.stream(gateway, request, envelope, stops, include_usage, {})
    return await completions.answer(gateway, request, envelope, stops, {})


def check_token(request: Request, expected: bytes | None) -> None:
    if expected is None:
        return
    given = request.headers.get("authorization")
    if given is None:
        raise ApiError(401, "missing Authorization: Bearer <token> header", None, "invalid_api_key")
    if not hmac.compare_digest(given.encode("utf-8", "replace"), expected):
        raise ApiError(401, "invalid bearer token", None, "invalid_api_key")


async def read_body(request: Request, schema: type[BaseModel], limit: int) -> BaseModel:
    """The body, at most `limit` bytes, as JSON (UTF-8, no lone surrogates), validated by `schema`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise bad_request(None, f"request body over {limit} bytes", "body_too_large")
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > limit:
            raise bad_request(None, f"request body over {limit} bytes", "body_too_large")
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
        json.dumps(obj, ensure_ascii=False).encode("utf-8")  # lone surrogates ("\\ud800") fail here
    except RecursionError:
        raise bad_request(None, "request body nested too deeply", "invalid_json") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError / UnicodeEncodeError, int too long
        raise bad_request(None, f"request body is not valid JSON: {str(e)[:200]}", "invalid_json") from None
    if not isinstance(obj, dict):
        raise bad_request(None, "request body must be a JSON object", "invalid_json")
    try:
        return schema.model_validate(obj)
    except ValidationError as e:
        first = e.errors(include_url=False, include_input=False)[0]
        param = field_path(first["loc"]) or None
        raise bad_request(param, first["msg"][:300]) from None


def field_path(loc: tuple) -> str:
    """("messages", 0, "content") -> "messages[0].content"; pydantic's union branch names are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or part in ("str", "list", "int", "float", "bool"):
            continue  # a union member's label, e.g. "list[TextPart]"
        else:
            out += ("." if out else "") + str(part)
    return out


# -- the server ------------------------------------------------------------------------------
@dataclass
class RunningHttp:
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    def begin_drain(self) -> None:
        """/health answers 503 and new API calls are refused; requests in flight go on."""
        self.app.state.draining = True

    def stop(self, grace_s: float) -> None:
        """Let requests in flight finish (within `grace_s`), then stop serving."""
        self.begin_drain()
        self.server.config.timeout_graceful_shutdown = max(1, int(grace_s))
        self.server.should_exit = True
        self.thread.join(grace_s + 5)
        self.app.state.gateway.close()


def start_http(host: str, port: int, engine: EngineProtocol, admission: Admission, metrics: Metrics,
               settings: HttpSettings, tls: tuple[str, str] | None = None) -> RunningHttp:
    """Bind host:port (0: any free port; a busy port is SystemExit) and serve on a thread; returns once up."""
    app = create_app(engine, admission, metrics, settings)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio sets TCP_NODELAY on accepted sockets only when it is IPPROTO_TCP (with 0, every
    # response's second write waits out the client's delayed ACK: 40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart binds through TIME_WAIT, as uvicorn does
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise SystemExit(f"ragkv: cannot listen on {host}:{port} (HTTP): {e}") from e
    sock.listen(128)
    sock.setblocking(False)
    ssl = {"ssl_certfile": tls[0], "ssl_keyfile": tls[1]} if tls else {}
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", **ssl)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="ragkv-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        raise SystemExit(f"ragkv: the HTTP server did not start on {host}:{port}")
    return RunningHttp(app, server, thread, sock.getsockname()[1])


def served_models(model: str) -> tuple[str, ...]:
    """The names a request's `model` may use: the --model value, and a directory's base name."""
    import os

    base = os.path.basename(model.rstrip("/"))
    return (model,) if base in ("", model) else (base, model)


def serve_http(config, engine: EngineProtocol, admission: Admission, metrics: Metrics) -> RunningHttp:
    """The API of `ragkv serve --http-port` (a ServeConfig): its host, token and TLS files."""
    settings = HttpSettings(models=served_models(config.model), token=config.token)
    tls = (config.tls_cert, config.tls_key) if config.tls else None
    return start_http(config.host, config.http_port, engine, admission, metrics, settings, tls)
