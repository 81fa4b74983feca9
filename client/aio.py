"""AsyncRagKVClient: the asyncio SDK (grpc.aio); same methods as RagKVClient, awaitable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import _channel, _messages
from client.types import ChunkRef, Compression, GenerateResult, RagKVError
from ragkv.v1 import ragkv_pb2 as pb
from ragkv.v1 import ragkv_pb2_grpc


class AsyncGenerateStream:
    """`async for piece in stream`; `stream.result` holds the full GenerateResult afterwards."""

    def __init__(self, call):
        self._call = call
        self.result: GenerateResult | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        try:
            async for msg in self._call:
                if msg.WhichOneof("event") == "text":
                    yield msg.text
                else:
                    self.result = _messages.generate_result(msg.result)
        except grpc.RpcError as e:
            raise RagKVError.from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()


class AsyncRagKVClient:
    """Asyncio client; arguments as RagKVClient. Use `async with AsyncRagKVClient(...) as c:`."""

    def __init__(self, target: str = "127.0.0.1:50051", token: str | None = None, *, tls: bool = False,
                 root_certificates: bytes | str | Path | None = None, timeout: float | None = None,
                 retry: _channel.Retry = _channel.Retry(), options: list | None = None):
        creds = _channel.credentials(tls, root_certificates)
        opts = _channel.options(options)
        self._channel = (grpc.aio.secure_channel(target, creds, opts) if creds is not None
                         else grpc.aio.insecure_channel(target, opts))
        self._stub = ragkv_pb2_grpc.RagKVStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = _channel.metadata(token)
        self.timeout = timeout
        self.retry = retry

    async def _call(self, method, request, *, idempotent: bool, timeout: float | None):
        delays = self.retry.delays() if idempotent else iter(())
        while True:
            try:
                return await method(request, timeout=timeout if timeout is not None else self.timeout,
                                    metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() in _channel.RETRYABLE:
                    delay = next(delays, None)
                    if delay is not None:
                        await asyncio.sleep(delay)
                        continue
                raise RagKVError.from_rpc_error(e) from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncRagKVClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def health(self, service: str = "", *, timeout: float | None = None) -> str:
        resp = await self._call(self._health.Check, health_pb2.HealthCheckRequest(service=service), idempotent=True,
                                timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    async def ingest(self, texts: Sequence[str], pin: bool = False, compression: Compression | None = None,
                     namespace: str = "", *, timeout: float | None = None) -> list[ChunkRef]:
        resp = await self._call(self._stub.Ingest, _messages.ingest_request(texts, pin, namespace, compression),
                                idempotent=True, timeout=timeout)
        return _messages.chunk_refs(resp)

    async def generate(self, question: str, chunks: Sequence[str | ChunkRef] = (), system_prompt: str = "",
                       max_new_tokens: int = 64, mode: str = "blend", recompute_ratio: float | None = None,
                       compression: Compression | None = None, *, temperature: float | None = None,
                       top_p: float | None = None, seed: int | None = None, namespace: str = "",
                       timeout: float | None = None) -> GenerateResult:
        request = _messages.generate_request(question, chunks, system_prompt, max_new_tokens, mode, recompute_ratio,
                                             compression, temperature, top_p, seed, namespace)
        resp = await self._call(self._stub.Generate, request, idempotent=False, timeout=timeout)
        return _messages.generate_result(resp)

    def generate_stream(self, question: str, chunks: Sequence[str | ChunkRef] = (), system_prompt: str = "",
                        max_new_tokens: int = 64, mode: str = "blend", recompute_ratio: float | None = None,
                        compression: Compression | None = None, *, temperature: float | None = None,
                        top_p: float | None = None, seed: int | None = None, namespace: str = "",
                        timeout: float | None = None) -> AsyncGenerateStream:
        """Not a coroutine: `async for piece in c.generate_stream(...)`."""
        request = _messages.generate_request(question, chunks, system_prompt, max_new_tokens, mode, recompute_ratio,
                                             compression, temperature, top_p, seed, namespace)
        call = self._stub.GenerateStream(request, timeout=timeout if timeout is not None else self.timeout,
                                         metadata=self._metadata)
        return AsyncGenerateStream(call)

    async def lookup(self, ids: Sequence[str | ChunkRef], namespace: str = "", *,
                     timeout: float | None = None) -> list[bool]:
        resp = await self._call(self._stub.Lookup, pb.LookupRequest(ids=_messages.ids(ids), namespace=namespace),
                                idempotent=True, timeout=timeout)
        return list(resp.present)

    async def pin(self, ids: Sequence[str | ChunkRef], namespace: str = "", *, timeout: float | None = None) -> int:
        return (await self._call(self._stub.Pin, pb.PinRequest(ids=_messages.ids(ids), namespace=namespace),
                                 idempotent=True, timeout=timeout)).count

    async def unpin(self, ids: Sequence[str | ChunkRef], namespace: str = "", *, timeout: float | None = None) -> int:
        return (await self._call(self._stub.Unpin, pb.UnpinRequest(ids=_messages.ids(ids), namespace=namespace),
                                 idempotent=True, timeout=timeout)).count

    async def evict(self, ids: Sequence[str | ChunkRef], namespace: str = "", *, timeout: float | None = None) -> int:
        return (await self._call(self._stub.Evict, pb.EvictRequest(ids=_messages.ids(ids), namespace=namespace),
                                 idempotent=False, timeout=timeout)).count

    async def stats(self, *, timeout: float | None = None) -> dict:
        return _messages.stats(await self._call(self._stub.Stats, pb.StatsRequest(), idempotent=True, timeout=timeout))
