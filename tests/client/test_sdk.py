"""The SDK on its own: no torch, retries, argument conversion (an in-process stand-in server)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from client import AsyncRagKVClient, ChunkRef, Compression, RagKVClient, RagKVError, Retry
from client import _messages
from ragkv.v1 import ragkv_pb2 as pb
from ragkv.v1 import ragkv_pb2_grpc

FAST = Retry(attempts=4, initial_s=0.01, max_s=0.02)


def test_client_imports_no_torch():
    code = "import client, sys; assert 'torch' not in sys.modules, 'client imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


class Flaky(ragkv_pb2_grpc.RagKVServicer):
    """Fails the first `failures` calls of each method with UNAVAILABLE."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls: dict[str, int] = {}

    def _tick(self, name, context):
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls[name] <= self.failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")

    def Lookup(self, request, context):
        self._tick("Lookup", context)
        return pb.LookupResponse(present=[True] * len(request.ids))

    def Generate(self, request, context):
        self._tick("Generate", context)
        return pb.GenerateResponse(text="ok")

    def Ingest(self, request, context):
        self._tick("Ingest", context)
        return pb.IngestResponse(chunks=[pb.ChunkRef(id="a" * 64, num_tokens=1) for _ in request.texts])


@pytest.fixture
def flaky():
    servicer = Flaky(failures=2)
    server = grpc.server(ThreadPoolExecutor(4))
    ragkv_pb2_grpc.add_RagKVServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_idempotent_calls_retry_unavailable(flaky):
    servicer, target = flaky
    with RagKVClient(target, timeout=5, retry=FAST) as c:
        assert c.lookup(["a" * 64]) == [True]
        assert c.ingest(["x"])[0] == ChunkRef(id="a" * 64, num_tokens=1, cached=False)
        with pytest.raises(RagKVError) as e:
            c.generate("q?", chunks=["x"])  # not idempotent: no retry
        assert e.value.code == grpc.StatusCode.UNAVAILABLE and e.value.message == "warming up"
    assert servicer.calls == {"Lookup": 3, "Ingest": 3, "Generate": 1}


def test_retries_give_up(flaky):
    servicer, target = flaky
    servicer.failures = 10
    with RagKVClient(target, timeout=5, retry=Retry(attempts=2, initial_s=0.01)) as c:
        with pytest.raises(RagKVError) as e:
            c.lookup(["a" * 64])
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and servicer.calls["Lookup"] == 2


def test_async_retries(flaky):
    servicer, target = flaky

    async def main():
        async with AsyncRagKVClient(target, timeout=5, retry=FAST) as c:
            assert await c.lookup([ChunkRef("a" * 64, 1, True)]) == [True]

    asyncio.run(main())
    assert servicer.calls["Lookup"] == 3


def test_request_building():
    msg = _messages.generate_request("q?", [ChunkRef("b" * 64, 2, True), "text"], max_new_tokens=8, mode="reuse",
                                     compression_=Compression("streaming", 16, window=4), seed=3)
    assert list(msg.chunks) == ["b" * 64, "text"]
    assert msg.compression.WhichOneof("budget") == "budget_tokens" and msg.compression.budget_tokens == 16
    assert msg.compression.window == 4 and msg.seed == 3 and not msg.HasField("temperature")
    frac = _messages.compression(Compression("h2o", 0.5))
    assert frac.WhichOneof("budget") == "budget_fraction" and not frac.HasField("window")
    with pytest.raises(TypeError):
        Compression("h2o", True)


def test_example_retriever(tmp_path):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "client" / "examples"))
    try:
        import rag_app
    finally:
        sys.path.pop(0)
    chunks = rag_app.split_chunks("Paris is in France.\n\nBananas are yellow fruit.\n\nOwls hunt at night.", 20)
    assert len(chunks) == 3
    assert rag_app.retrieve("Which fruit is yellow?", chunks, k=1) == [1]
