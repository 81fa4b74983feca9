"""The transport layer in-process, over a stand-in engine (no model): conversion, error mapping,
admission, the UTF-8 field finder, request ids."""

from __future__ import annotations

import threading

import grpc
import pytest

from client import Compression, RagKVClient, RagKVError
from ragkv.config import ServeConfig
from ragkv.errors import Cancelled, ResourceExhausted, Unavailable
from ragkv.server.admission import Admission
from ragkv.server.app import start_server
from ragkv.server.wire import invalid_utf8_field
from ragkv.v1 import ragkv_pb2 as pb
from workers.requests import ChunkRef, GenerateResult


class StandInEngine:
    max_batch = 1

    def __init__(self):
        self.requests = []
        self.fail: BaseException | None = None

    def generate(self, req, should_stop=None):
        self.requests.append(req)
        if self.fail is not None:
            raise self.fail
        return GenerateResult(text="ok", token_ids=[1], prompt_token_ids=[2, 3], ttft_s=0.01, total_s=0.02,
                              stats={"chunks_hit": 1, "chunks_computed": 0, "note": "extra"})

    def generate_stream(self, req, should_stop=None):
        yield "o"
        yield "k"
        yield self.generate(req, should_stop)

    def ingest(self, texts, pin=False, namespace=""):
        return [ChunkRef(id="a" * 64, num_tokens=3, cached=False) for _ in texts]

    def stats(self):
        return {"store": {"backend": {"backend": "memory", "bytes_used": 10, "blocks": 1, "evictions": 2}}}

    def close(self):
        pass


@pytest.fixture(scope="module")
def stand_in():
    engine = StandInEngine()
    running = start_server(ServeConfig(port=0, max_queue=2), engine)
    yield engine, f"127.0.0.1:{running.port}"
    running.drain(1)


def test_defaults_and_conversion(stand_in):
    engine, target = stand_in
    with RagKVClient(target, timeout=10) as c:
        r = c.generate("q?", chunks=["a"], compression=Compression("h2o", 32, window=8))
        assert r.text == "ok" and r.stats["note"] == "extra" and r.stats["chunks_hit"] == 1
        req = engine.requests[-1]
        assert (req.mode, req.max_new_tokens, req.recompute_ratio, req.seed) == ("blend", 64, None, None)
        assert req.compression.budget == 32 and isinstance(req.compression.budget, int)
        assert (req.compression.window, req.compression.sink_tokens, req.compression.protect_system_prompt) == (8, 4, True)
        c.generate("q?", chunks=["a"], compression=Compression("snapkv", 0.25, protect_system_prompt=False), seed=7)
        req = engine.requests[-1]
        assert req.compression.budget == 0.25 and not req.compression.protect_system_prompt and req.seed == 7


def test_unexpected_error_is_internal_and_generic(stand_in):
    engine, target = stand_in
    engine.fail = RuntimeError("secret detail")
    try:
        with RagKVClient(target, timeout=10) as c:
            with pytest.raises(RagKVError) as e:
                c.generate("q?", chunks=["a"])
            assert e.value.code == grpc.StatusCode.INTERNAL
            assert "secret" not in e.value.message and "request id" in e.value.message
            with pytest.raises(RagKVError) as e:
                list(c.generate_stream("q?", chunks=["a"]))
            assert e.value.code == grpc.StatusCode.INTERNAL
            engine.fail = Unavailable("store down")
            with pytest.raises(RagKVError) as e:
                c.generate("q?", chunks=["a"])
            assert e.value.code == grpc.StatusCode.UNAVAILABLE and e.value.message == "store down"
            engine.fail = None
            assert c.generate("q?", chunks=["a"]).text == "ok"  # still serving
    finally:
        engine.fail = None


def test_request_id_is_echoed(stand_in):
    _, target = stand_in
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/ragkv.v1.RagKV/Stats", request_serializer=pb.StatsRequest.SerializeToString,
                                   response_deserializer=pb.StatsResponse.FromString)
        _, rpc = call.with_call(pb.StatsRequest(), metadata=(("x-request-id", "req-42"),), timeout=10)
        assert dict(rpc.initial_metadata())["x-request-id"] == "req-42"


def test_invalid_utf8_field_names_nested_fields():
    msg = pb.GenerateRequest(question="q", chunks=["a", "b"], compression=pb.Compression(policy="PPPP"))
    data = msg.SerializeToString()
    assert invalid_utf8_field(pb.GenerateRequest.DESCRIPTOR, data) is None
    bad = data.replace(b"PPPP", b"\xc3\x28\xa0\xa1")
    assert invalid_utf8_field(pb.GenerateRequest.DESCRIPTOR, bad) == "compression.policy"
    assert invalid_utf8_field(pb.GenerateRequest.DESCRIPTOR, b"\x0a\xff") is None  # truncated: no claim


def test_admission_bounds_the_queue():
    admission = Admission(max_queue=1)
    release, entered = threading.Event(), threading.Event()

    def holder():
        with admission.slot():
            entered.set()
            release.wait(5)

    def waiter():
        with admission.slot():
            pass

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    entered.wait(5)
    threads.append(threading.Thread(target=waiter))
    threads[1].start()
    while admission.waiting != 1:
        pass
    with pytest.raises(ResourceExhausted):
        with admission.slot():
            pass
    release.set()
    for t in threads:
        t.join(5)
    assert (admission.in_flight, admission.waiting) == (0, 0)
    outcome = []

    def cancelled_waiter():
        try:
            with admission.slot(should_stop=lambda: True):
                outcome.append("ran")
        except Cancelled:
            outcome.append("cancelled")

    with admission.slot():  # a waiter whose RPC is gone leaves the queue without running
        t = threading.Thread(target=cancelled_waiter)
        t.start()
        t.join(5)
    assert outcome == ["cancelled"] and admission.waiting == 0
