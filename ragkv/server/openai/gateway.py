"""The engine, from asyncio: every call holds an admission slot (the gRPC server's queue) on a thread of
its own pool, so a full queue answers 429 at once and the event loop never blocks on model work.

A stream is a thread that iterates engine.generate_stream under the slot and hands each item to the
event loop; the handler waits for the first item before it answers, so an error raised before any
token (a bad chunk id, a full queue) is an HTTP status, not a broken stream. A client that goes away
sets `stop`: the engine stops at its next step and the slot is freed.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

from ragkv.server.admission import Admission
from workers.protocol import EngineProtocol
from workers.requests import GenerateRequest, GenerateResult

SPARE_THREADS = 8
_END = object()


class Gateway:
    def __init__(self, engine: EngineProtocol, admission: Admission):
        self.engine, self.admission = engine, admission
        self.pool = ThreadPoolExecutor(admission.max_queue + admission.slots + SPARE_THREADS,
                                       thread_name_prefix="http")
        self.closing = threading.Event()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        stop = self.closing.is_set

        def work() -> GenerateResult:
            with self.admission.slot(stop):
                return self.engine.generate(request, should_stop=stop)

        return await asyncio.get_running_loop().run_in_executor(self.pool, work)

    def stream(self, request: GenerateRequest) -> "Stream":
        return Stream(self, request)

    def close(self) -> None:
        self.closing.set()
        self.pool.shutdown(wait=False, cancel_futures=True)


class Stream:
    """engine.generate_stream on a pool thread; `async for` gives its items (text pieces, then the result)."""

    def __init__(self, gateway: Gateway, request: GenerateRequest):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.stopped = threading.Event()
        loop = asyncio.get_running_loop()
        stop = lambda: self.stopped.is_set() or gateway.closing.is_set()  # noqa: E731

        def put(item) -> None:
            loop.call_soon_threadsafe(self.queue.put_nowait, item)

        def work() -> None:
            try:
                with gateway.admission.slot(stop):
                    for item in gateway.engine.generate_stream(request, should_stop=stop):
                        put(item)
                        if self.stopped.is_set():
                            break
            except BaseException as e:  # handed to the reader, raised there
                put(e)
            put(_END)

        gateway.pool.submit(work)

    def stop(self) -> None:
        self.stopped.set()

    async def __aiter__(self) -> AsyncIterator[str | GenerateResult]:
        while True:
            item = await self.queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
