"""Auth on every RagKV method, namespaces isolated, the Redis password never leaks, and hostile
requests refused with INVALID_ARGUMENT / RESOURCE_EXHAUSTED while the server keeps serving.

One `ragkv serve` subprocess with --token and a password-protected redis-server as its store.
TLS end to end is covered by tests/server/test_server_ops.py::test_tls_and_token."""

from __future__ import annotations

import inspect
import json
import math

import grpc
import pytest

from client import RagKVClient, RagKVError
from kvstore.testing import RedisServer
from kvstore.testing import free_port
from ragkv.server import interceptors
from ragkv.v1 import ragkv_pb2 as pb
from servers import serving

pytestmark = pytest.mark.timeout(400)

TOKEN = "tok-7f3a9c"
PASSWORD = "secret-redis-pw-93d1"
SERVICE = pb.DESCRIPTOR.services_by_name["RagKV"]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("guarded")
    redis_server = RedisServer(workdir / "redis", free_port(), password=PASSWORD, persist=False).start()
    try:
        with serving(workdir, "--token", TOKEN, "--store", redis_server.url, "--log-level", "DEBUG") as server:
            yield server
    finally:
        redis_server.kill()


@pytest.fixture(scope="module")
def client(guarded):
    with RagKVClient(guarded.target, token=TOKEN, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def channel(guarded):
    with grpc.insecure_channel(guarded.target) as ch:
        yield ch


def raw_call(channel, method, payload: bytes, token: str | None = TOKEN):
    """Send raw request bytes (whatever a hostile client can put on the wire) to RagKV/`method`."""
    path = f"/{SERVICE.full_name}/{method.name}"
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    if method.server_streaming:
        call = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        return list(call(payload, metadata=metadata, timeout=60))
    return channel.unary_unary(path, request_serializer=None, response_deserializer=None)(
        payload, metadata=metadata, timeout=60)


# -- authentication ------------------------------------------------------------------------------

@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", TOKEN[:-1], ""])
def test_every_ragkv_method_requires_the_token(guarded, channel, token):
    assert len(SERVICE.methods) >= 8  # Ingest Generate GenerateStream Lookup Pin Unpin Evict Stats
    for method in SERVICE.methods:
        with pytest.raises(grpc.RpcError) as e:
            raw_call(channel, method, b"", token=token)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, method.name
    with RagKVClient(guarded.target, token=token or None, timeout=30) as anyone:
        assert anyone.health() == "SERVING"  # only the health service is open


def test_token_compared_in_constant_time():
    source = inspect.getsource(interceptors.AuthInterceptor)
    assert "hmac.compare_digest(" in source
    assert "== self._expected" not in source and "!= self._expected" not in source


# -- namespaces ----------------------------------------------------------------------------------

def test_namespaces_are_isolated(client):
    text = "The vault code of the Amberline office is 5521."
    [a] = client.ingest([text], namespace="tenant-a")
    [b] = client.ingest([text], namespace="tenant-b")
    assert a.id != b.id and not b.cached  # same text, other namespace: another block
    [c] = client.ingest(["Only tenant A knows the river is called Moss."], namespace="tenant-a")
    assert client.lookup([a.id, c.id], namespace="tenant-a") == [True, True]
    assert client.lookup([a.id, c.id], namespace="tenant-b") == [False, False]
    assert client.lookup([c.id]) == [False]  # the default namespace is a namespace too
    with pytest.raises(RagKVError) as e:
        client.generate("What is the river called?", chunks=[c.id], namespace="tenant-b", max_new_tokens=2)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert client.pin([c.id], namespace="tenant-b") == 0
    assert client.evict([c.id], namespace="tenant-b") == 0
    assert client.lookup([c.id], namespace="tenant-a") == [True]  # untouched by B's evict
    r = client.generate("What is the river called?", chunks=[c.id], namespace="tenant-a", max_new_tokens=2,
                        recompute_ratio=0.15)  # a ratio that blends: the stored chunk is read
    assert r.stats["chunks_hit"] == 1
    assert client.evict([c.id], namespace="tenant-a") == 1


# -- the redis password --------------------------------------------------------------------------

def test_redis_password_never_logged_nor_reported(guarded, client):
    client.ingest(["A chunk to make the store do some work."])
    stats = client.stats()
    assert stats["engine"]["store"]["backend"]["backend"] == "redis"
    assert PASSWORD not in json.dumps(stats)
    text = guarded.stderr_path.read_text(errors="replace") + "\n".join(guarded.stdout_lines)
    assert '"store"' in text or "store" in text
    assert PASSWORD not in text


# -- hostile requests ----------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, value: bytes) -> bytes:
    return _varint(number << 3 | wire) + value


def _string(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


GEN = SERVICE.methods_by_name["Generate"]
OK_GEN = pb.GenerateRequest(question="q?", chunks=["Some text."], max_new_tokens=1).SerializeToString()


def _gen(**fields) -> bytes:
    msg = pb.GenerateRequest(question="q?", chunks=["Some text."], max_new_tokens=1)
    for k, v in fields.items():
        if k == "compression":
            msg.compression.CopyFrom(v)
        elif isinstance(v, list):
            getattr(msg, k).extend(v)
        else:
            setattr(msg, k, v)
    return msg.SerializeToString()


HOSTILE = {
    # absurd numbers
    "max_new_tokens=2**31 (wire)": (GEN, OK_GEN + _field(4, 0, _varint(1 << 31))),
    "max_new_tokens=2**31-1": (GEN, _gen(max_new_tokens=2**31 - 1)),
    "max_new_tokens=-1": (GEN, _gen(max_new_tokens=-1)),
    "recompute_ratio=NaN": (GEN, _gen(recompute_ratio=math.nan)),
    "recompute_ratio=inf": (GEN, _gen(recompute_ratio=math.inf)),
    "temperature=NaN": (GEN, _gen(temperature=math.nan)),
    "top_p=-inf": (GEN, _gen(top_p=-math.inf)),
    "budget_fraction<0": (GEN, _gen(compression=pb.Compression(policy="snapkv", budget_fraction=-0.5))),
    "budget_fraction=NaN": (GEN, _gen(compression=pb.Compression(policy="snapkv", budget_fraction=math.nan))),
    "budget_tokens<0": (GEN, _gen(compression=pb.Compression(policy="h2o", budget_tokens=-5))),
    "sink_tokens<0": (GEN, _gen(compression=pb.Compression(policy="h2o", budget_fraction=0.5, sink_tokens=-1))),
    "window=-2**31": (GEN, _gen(compression=pb.Compression(policy="streaming", budget_fraction=0.5, window=-2**31))),
    "unknown policy": (GEN, _gen(compression=pb.Compression(policy="rm -rf"))),
    "unknown mode": (GEN, _gen(mode="turbo")),
    # oversized / repeated
    "question 100k chars": (GEN, _gen(question="q" * 100_000)),
    "chunk 1M chars": (GEN, _gen(chunks=["x" * 1_000_000])),
    "100k chunk ids": (GEN, _gen(chunks=["0" * 64] * 100_000)),
    "100k empty chunks": (GEN, _gen(chunks=[""] * 100_000)),
    "namespace 10k chars": (GEN, _gen(namespace="n" * 10_000)),
    "namespace with NUL": (GEN, _gen(namespace="\x00prefix")),
    "system prompt 1M": (GEN, _gen(system_prompt="s" * 1_000_000)),
    "lookup 100k ids": (SERVICE.methods_by_name["Lookup"], pb.LookupRequest(ids=["a" * 64] * 100_000).SerializeToString()),
    "pin bad id": (SERVICE.methods_by_name["Pin"], pb.PinRequest(ids=["../../etc/passwd"]).SerializeToString()),
    "evict 100k ids": (SERVICE.methods_by_name["Evict"], pb.EvictRequest(ids=["b" * 64] * 100_000).SerializeToString()),
    "ingest 100k texts": (SERVICE.methods_by_name["Ingest"], pb.IngestRequest(texts=["t"] * 100_000).SerializeToString()),
    "ingest empty text": (SERVICE.methods_by_name["Ingest"], pb.IngestRequest(texts=["  "]).SerializeToString()),
    # malformed wire
    "invalid UTF-8 question": (GEN, _string(1, b"\xff\xfe\xfd") + _string(2, b"ok")),
    "invalid UTF-8 chunk": (GEN, _string(1, b"q?") + _string(2, b"ok") + _string(2, b"\xc3\x28")),
    "invalid UTF-8 namespace": (SERVICE.methods_by_name["Ingest"], _string(1, b"text") + _string(3, b"\xed\xa0\x80")),
    "truncated message": (GEN, OK_GEN[:-3]),
    "garbage bytes": (GEN, bytes(range(256)) * 4),
    "stream: NaN ratio": (SERVICE.methods_by_name["GenerateStream"], _gen(recompute_ratio=math.nan)),
}
REFUSED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_request_is_refused_and_server_keeps_serving(channel, client, case):
    method, payload = HOSTILE[case]
    with pytest.raises(grpc.RpcError) as e:
        raw_call(channel, method, payload)
    assert e.value.code() in REFUSED, (case, e.value.code(), e.value.details())
    assert e.value.details() and "Traceback" not in e.value.details()
    assert client.health(timeout=10) == "SERVING"


def test_server_still_answers_after_the_barrage(client):
    r = client.generate("What colour are bananas?", chunks=["Bananas are yellow."], max_new_tokens=3)
    assert r.token_ids
