"""RagKVClient: the blocking SDK."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import _channel, _messages
from client.types import ChunkRef, Compression, GenerateResult, RagKVError
from ragkv.v1 import ragkv_pb2 as pb
from ragkv.v1 import ragkv_pb2_grpc


class GenerateStream:
    """Iterates the text pieces of a streamed generation; `result` holds the full GenerateResult
    once iteration has finished. `cancel()` stops the server-side generation."""

    def __init__(self, call):
        self._call = call
        self.result: GenerateResult | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            for msg in self._call:
                if msg.WhichOneof("event") == "text":
                    yield msg.text
                else:
                    self.result = _messages.generate_result(msg.result)
        except grpc.RpcError as e:
            raise RagKVError.from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()


class RagKVClient:
    """Blocking client. `target` is "host:port"; `token` is sent as a bearer token; TLS is used when
    `tls` is true or `root_certificates` (PEM bytes or a path) is given. `timeout` (seconds) is the
    default deadline of every call. Idempotent calls retry UNAVAILABLE with exponential backoff."""

    def __init__(self, target: str = "127.0.0.1:50051", token: str | None = None, *, tls: bool = False,
                 root_certificates: bytes | str | Path | None = None, timeout: float | None = None,
                 retry: _channel.Retry = _channel.Retry(), options: list | None = None):
        creds = _channel.credentials(tls, root_certificates)
        opts = _channel.options(options)
        self._channel = (grpc.secure_channel(target, creds, opts) if creds is not None
                         else grpc.insecure_channel(target, opts))
        self._stub = ragkv_pb2_grpc.RagKVStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = _channel.metadata(token)
        self.timeout = timeout
        self.retry = retry

    # -- plumbing ---------------------------------------------------------------
    def _call(self, method, request, *, idempotent: bool, timeout: float | None):
        delays = self.retry.delays() if idempotent else iter(())
        while True:
            try:
                return method(request, timeout=timeout if timeout is not None else self.timeout,
                              metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() in _channel.RETRYABLE:
                    delay = next(delays, None)
                    if delay is not None:
                        time.sleep(delay)
                        continue
                raise RagKVError.from_rpc_error(e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "RagKVClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- API --------------------------------------------------------------------
    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """The standard grpc.health.v1 status name: "SERVING", "NOT_SERVING", ..."""
        resp = self._call(self._health.Check, health_pb2.HealthCheckRequest(service=service), idempotent=True,
                          timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    def ingest(self, texts: Sequence[str], pin: bool = False, compression: Compression | None = None,
               namespace: str = "", *, timeout: float | None = None) -> list[ChunkRef]:
        """Store each text's KV; `compression` (a query-agnostic policy such as kvzip) stores it already
        compressed, under an id that includes the spec."""
        resp = self._call(self._stub.Ingest, _messages.ingest_request(texts, pin, namespace, compression),
                          idempotent=True, timeout=timeout)  # content-addressed: ingesting twice is harmless
        return _messages.chunk_refs(resp)

    def generate(self, question: str, chunks: Sequence[str | ChunkRef] = (), system_prompt: str = "",
                 max_new_tokens: int = 64, mode: str = "blend", recompute_ratio: float | None = None,
                 compression: Compression | None = None, *, temperature: float | None = None,
                 top_p: float | None = None, seed: int | None = None, namespace: str = "",
                 timeout: float | None = None) -> GenerateResult:
        request = _messages.generate_request(question, chunks, system_prompt, max_new_tokens, mode, recompute_ratio,
                                             compression, temperature, top_p, seed, namespace)
        return _messages.generate_result(self._call(self._stub.Generate, request, idempotent=False, timeout=timeout))

    def generate_stream(self, question: str, chunks: Sequence[str | ChunkRef] = (), system_prompt: str = "",
                        max_new_tokens: int = 64, mode: str = "blend", recompute_ratio: float | None = None,
                        compression: Compression | None = None, *, temperature: float | None = None,
                        top_p: float | None = None, seed: int | None = None, namespace: str = "",
                        timeout: float | None = None) -> GenerateStream:
        """Iterate for text pieces; the returned stream's `.result` is the full result afterwards."""
        request = _messages.generate_request(question, chunks, system_prompt, max_new_tokens, mode, recompute_ratio,
                                             compression, temperature, top_p, seed, namespace)
        call = self._stub.GenerateStream(request, timeout=timeout if timeout is not None else self.timeout,
                                         metadata=self._metadata)
        return GenerateStream(call)

    def lookup(self, ids: Sequence[str | ChunkRef], namespace: str = "", *, timeout: float | None = None) -> list[bool]:
        resp = self._call(self._stub.Lookup, pb.LookupRequest(ids=_messages.ids(ids), namespace=namespace),
                          idempotent=True, timeout=timeout)
        return list(resp.present)

    def pin(self, ids: Sequence[str | ChunkRef], namespace: str = "", *, timeout: float | None = None) -> int:
        return self._call(self._stub.Pin, pb.PinRequest(ids=_messages.ids(ids), namespace=namespace),
                          idempotent=True, timeout=timeout).count

    def unpin(self, ids: Sequence[str | ChunkRef], namespace: str = "", *, timeout: float | None = None) -> int:
        return self._call(self._stub.Unpin, pb.UnpinRequest(ids=_messages.ids(ids), namespace=namespace),
                          idempotent=True, timeout=timeout).count

    def evict(self, ids: Sequence[str | ChunkRef], namespace: str = "", *, timeout: float | None = None) -> int:
        return self._call(self._stub.Evict, pb.EvictRequest(ids=_messages.ids(ids), namespace=namespace),
                          idempotent=False, timeout=timeout).count

    def stats(self, *, timeout: float | None = None) -> dict:
        """{"server": {version, uptime_s, in_flight, queued, max_queue}, "engine": Engine.stats()}"""
        return _messages.stats(self._call(self._stub.Stats, pb.StatsRequest(), idempotent=True, timeout=timeout))
