"""Operations against a real `ragkv serve`: auth, TLS, health, reflection, metrics, deadlines,
concurrency, the bounded queue and the SIGTERM drain."""

from __future__ import annotations

import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from conftest import CHUNKS, TOKEN
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from serving_helpers import ServerProcess

from client import RagKVClient, RagKVError

Q = "What is the capital of France?"


def test_ready_line_is_exactly_one(server):
    assert server.stdout_lines == [f"ragkv listening on {server.target}"]


def test_standard_health_and_reflection(server):
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "ragkv.v1.RagKV"):
            assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        (reply,) = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                   timeout=10)
        names = {s.name for s in reply.list_services_response.service}
    assert {"ragkv.v1.RagKV", "grpc.health.v1.Health"} <= names


def test_tls_and_token(guarded_server, tls_cert):
    cert, _ = tls_cert
    with RagKVClient(guarded_server.target, token=TOKEN, root_certificates=cert, timeout=30) as c:
        assert c.health() == "SERVING"
        assert c.lookup(["0" * 64]) == [False]
    for token in (None, "wrong-token"):
        with RagKVClient(guarded_server.target, token=token, root_certificates=cert, timeout=30) as c:
            assert c.health() == "SERVING"  # health stays open
            with pytest.raises(RagKVError) as e:
                c.stats()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(RagKVError) as e:
                list(c.generate_stream(Q, chunks=CHUNKS[:1], max_new_tokens=2))
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    # A plaintext client cannot talk to the TLS port.
    with RagKVClient(guarded_server.target, token=TOKEN, timeout=5, retry=_no_retry()) as c:
        with pytest.raises(RagKVError) as e:
            c.stats()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def _no_retry():
    from client import Retry

    return Retry(attempts=1)


def test_queue_full_is_resource_exhausted(guarded_server, tls_cert):
    cert, _ = tls_cert
    codes: list[str] = []

    def slow(i: int) -> None:
        with RagKVClient(guarded_server.target, token=TOKEN, root_certificates=cert) as c:
            try:
                c.generate(f"Question {i}: tell me a long story about Paris.", chunks=CHUNKS[:1], mode="full",
                           max_new_tokens=64, timeout=4)
                codes.append("OK")
            except RagKVError as e:
                codes.append(e.code.name)
                if e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    assert "queue" in e.message

    with ThreadPoolExecutor(5) as pool:
        list(pool.map(slow, range(5)))
    assert "RESOURCE_EXHAUSTED" in codes, codes
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}, codes
    with RagKVClient(guarded_server.target, token=TOKEN, root_certificates=cert, timeout=30) as c:
        _wait_idle(c)


def _wait_idle(c: RagKVClient, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = c.stats()["server"]
        if s["in_flight"] == 0 and s["queued"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError("server did not become idle: a cancelled request kept computing")


def test_deadline_cancels_and_server_keeps_serving(client, refs):
    started = time.monotonic()
    with pytest.raises(RagKVError) as e:
        client.generate("Write a very long essay about France.", chunks=[refs[0]], mode="full", max_new_tokens=512,
                        timeout=1.0)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5
    _wait_idle(client, timeout=10)  # the engine stopped computing for the cancelled request
    assert client.generate(Q, chunks=[refs[0]], max_new_tokens=1).token_ids


def test_sixteen_concurrent_clients(server, refs):
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            with RagKVClient(server.target, timeout=120) as c:
                assert c.health() == "SERVING"
                assert c.lookup([refs[i % len(refs)]]) == [True]
                r = c.generate(f"Question {i}?", chunks=[refs[i % len(refs)]], mode="reuse", max_new_tokens=1)
                assert len(r.token_ids) <= 1 and r.stats["chunks_hit"] == 1  # served (an EOS first is no token)
        except BaseException as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors


def test_metrics_endpoint(server, client, refs):
    client.generate(Q, chunks=[refs[0]], max_new_tokens=1)
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    for name in ("ragkv_requests_total", "ragkv_ttft_seconds_bucket", "ragkv_chunk_hit_ratio", "ragkv_store_bytes",
                 "ragkv_store_evictions_total", "ragkv_request_seconds", "ragkv_queue_waiting",
                 "ragkv_sequence_hits_total", "ragkv_sequence_fills_total", "ragkv_shadow_dropped_total",
                 "ragkv_adaptive_changes_total", "ragkv_adaptive_ratio"):
        assert name in body, name
    assert 'ragkv_requests_total{code="OK",method="Generate",mode="blend"}' in body
    assert 'ragkv_blend_runs_total{ran="exact"}' in body  # the server's default ratio is served exactly
    assert 'ragkv_store_bytes{backend="disk"}' in body


def test_sigterm_drains_in_flight_request(tmp_path):
    proc = ServerProcess(tmp_path).start()
    try:
        result: dict = {}

        def call() -> None:
            with RagKVClient(proc.target, timeout=120) as c:
                try:
                    result["r"] = c.generate("Tell me about Paris.", chunks=CHUNKS[:1], mode="full", max_new_tokens=6)
                except RagKVError as e:
                    result["e"] = e

        worker = threading.Thread(target=call)
        worker.start()
        with RagKVClient(proc.target, timeout=30) as c:
            deadline = time.monotonic() + 60
            while c.stats()["server"]["in_flight"] == 0:
                assert time.monotonic() < deadline, "request never started"
                time.sleep(0.02)
        rc = proc.terminate(timeout=120)
        worker.join(timeout=60)
        assert "e" not in result, result.get("e")
        assert len(result["r"].token_ids) >= 1
        assert rc == 0, proc.stderr_tail()
        assert '"msg": "draining"' in proc.stderr_path.read_text()
    finally:
        proc.kill()
