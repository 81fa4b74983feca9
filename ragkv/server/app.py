"""Assemble and run the gRPC server: servicer + interceptors + health + reflection (+ TLS, metrics)."""

from __future__ import annotations

import gc
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kvstore.backends.redis_backend import redact_url
from ragkv.config import ServeConfig
from ragkv.server.admission import Admission
from ragkv.server.interceptors import AuthInterceptor, ErrorInterceptor, RequestLogInterceptor
from ragkv.server.metrics import Instrumented, Metrics
from ragkv.server.servicer import RagKVServicer
from ragkv.v1 import ragkv_pb2, ragkv_pb2_grpc
from workers.protocol import EngineProtocol

log = logging.getLogger("ragkv.server")

SERVICE_NAME = ragkv_pb2.DESCRIPTOR.services_by_name["RagKV"].full_name  # "ragkv.v1.RagKV"
SPARE_THREADS = 8  # beyond the engine's slots and the queue: health, stats and refusals stay served


@dataclass
class RunningServer:
    server: grpc.Server
    health: health.HealthServicer
    port: int
    metrics: Metrics
    engine: EngineProtocol | None = None  # the engine as the servicer calls it (Instrumented)
    admission: Admission | None = None
    http: object | None = None  # the OpenAI-compatible API (ragkv/server/openai/app.py RunningHttp), when on

    def drain(self, grace_s: float) -> None:
        """Stop taking requests (health NOT_SERVING), let in-flight ones finish within `grace_s`."""
        self.health.enter_graceful_shutdown()
        if self.http is not None:
            self.http.begin_drain()
        self.server.stop(grace_s).wait()
        if self.http is not None:
            self.http.stop(grace_s)


def grpc_options(config: ServeConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second server on a busy port must fail, not share it
    ]


def start_server(config: ServeConfig, engine: EngineProtocol, metrics: Metrics | None = None) -> RunningServer:
    """Serve `engine` on config.host:config.port (port 0: any free one); returns once started."""
    metrics = metrics or Metrics()
    slots = engine.max_batch  # the engine batches this many requests
    admission = Admission(config.max_queue, slots)
    metrics.watch(engine, admission)
    interceptors = [RequestLogInterceptor(metrics)]
    if config.token:
        interceptors.append(AuthInterceptor(config.token))
    interceptors.append(ErrorInterceptor())
    server = grpc.server(ThreadPoolExecutor(max_workers=config.max_queue + slots + SPARE_THREADS, thread_name_prefix="rpc"),
                         interceptors=interceptors, options=grpc_options(config))
    instrumented = Instrumented(engine, metrics)
    ragkv_pb2_grpc.add_RagKVServicer_to_server(RagKVServicer(instrumented, admission), server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)

    host = f"[{config.host}]" if ":" in config.host else config.host
    address = f"{host}:{config.port}"
    try:
        if config.tls:
            with open(config.tls_key, "rb") as k, open(config.tls_cert, "rb") as c:
                creds = grpc.ssl_server_credentials([(k.read(), c.read())])
            port = server.add_secure_port(address, creds)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as e:
        raise SystemExit(f"ragkv: cannot listen on {address}: {e}") from e
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server=server, health=health_servicer, port=port, metrics=metrics, engine=instrumented,
                         admission=admission)


def build_engine(config: ServeConfig) -> EngineProtocol:
    """The engine for `config`: in process (loads the model: seconds), or a thin front to Ray workers."""
    from workers.ray_pool import make_engine

    return make_engine(replace(config.engine, store=config.store_url))  # the driver resolves the default store


def serve(config: ServeConfig) -> int:
    """`ragkv serve`: load, listen, print the ready line, run until SIGTERM/SIGINT, drain, exit 0."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    engine = build_engine(config)
    scheduler = getattr(engine, "scheduler", None)  # in process: the batch runs on this, the main thread
    if scheduler is not None:
        scheduler.claim()  # before the first request can start a thread of its own
    gc.collect()
    gc.freeze()  # what start-up built (engine, store, servers): never scanned again; the model froze at load
    try:
        running = start_server(config, engine)
        if config.http_port is not None:  # the OpenAI-compatible API, same engine, token, queue and metrics
            from ragkv.server.openai.app import serve_http

            running.http = serve_http(config, running.engine, running.admission, running.metrics)
        if config.metrics_port is not None:
            from prometheus_client import start_http_server

            start_http_server(config.metrics_port, addr=config.host, registry=running.metrics.registry)
        log.info("serving", extra={"fields": {"address": f"{config.host}:{running.port}", "tls": config.tls,
                                              "auth": bool(config.token), "store": redact_url(config.store_url),
                                              "codec": config.codec, "workers": config.workers,
                                              "metrics_port": config.metrics_port, "max_queue": config.max_queue,
                                              "http_port": config.http_port and running.http.port}})
        print(f"ragkv listening on {config.host}:{running.port}", flush=True)
        drained = threading.Event()

        def drain_on_stop() -> None:
            stop.wait()
            log.info("draining", extra={"fields": {"grace_s": config.grace_s}})
            running.drain(config.grace_s)
            drained.set()

        threading.Thread(target=drain_on_stop, name="ragkv-drain", daemon=True).start()
        if scheduler is not None:
            scheduler.run(until=drained)
        else:
            while not drained.wait(0.5):
                pass
        log.info("stopped")
    finally:
        gc.unfreeze()  # let the interpreter tear the model down normally
        engine.close()
    return 0
