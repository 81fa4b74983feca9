"""Every RPC through the SDK (sync and asyncio) against a real `ragkv serve`, and every invalid input."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from conftest import CHUNKS

from client import AsyncRagKVClient, ChunkRef, Compression, GenerateResult, RagKVError
from ragkv.v1 import ragkv_pb2 as pb

Q = "What is the capital of France?"
SMALL = dict(max_new_tokens=4)


def test_health_and_ingest(client, refs):
    assert client.health() == "SERVING"
    assert client.health("ragkv.v1.RagKV") == "SERVING"
    assert [type(r) for r in refs] == [ChunkRef] * len(CHUNKS)
    assert all(len(r.id) == 64 and r.num_tokens > 0 for r in refs)
    again = client.ingest(CHUNKS[:1])
    assert again[0].id == refs[0].id and again[0].cached


def test_generate_by_text_and_by_id(client, refs):
    by_id = client.generate(Q, chunks=[refs[0], refs[1].id], mode="blend", **SMALL)
    assert isinstance(by_id, GenerateResult)
    assert by_id.text and 1 <= len(by_id.token_ids) <= 4
    assert by_id.ttft_s > 0 and by_id.total_s >= by_id.ttft_s
    for key in ("chunks_hit", "chunks_computed", "recomputed_tokens", "prompt_tokens", "kv_bytes_loaded"):
        assert key in by_id.stats
    assert by_id.stats["chunks_hit"] == 2
    by_text = client.generate(Q, chunks=CHUNKS[:2], mode="blend", **SMALL)
    assert by_text.prompt_token_ids == by_id.prompt_token_ids


def test_stream_pieces_join_to_the_final_text(client, refs):
    stream = client.generate_stream(Q, chunks=[refs[0]], mode="full", **SMALL)
    pieces = list(stream)
    assert pieces and stream.result is not None
    assert "".join(pieces) == stream.result.text


def test_lookup_pin_unpin_evict_stats(client):
    (ref,) = client.ingest(["Evictable chunk about owls."])
    assert client.lookup([ref, "f" * 64]) == [True, False]
    assert client.pin([ref]) == 1
    assert client.unpin([ref.id]) == 1
    assert client.evict([ref]) == 1
    assert client.lookup([ref]) == [False]
    stats = client.stats()
    assert stats["server"]["version"] and stats["server"]["max_queue"] >= 1
    assert isinstance(stats["engine"], dict) and stats["engine"]


def test_async_client_every_rpc(server):
    async def main():
        async with AsyncRagKVClient(server.target, timeout=60) as c:
            assert await c.health() == "SERVING"
            (ref,) = await c.ingest(["Async chunk: the sky is blue."])
            assert await c.lookup([ref]) == [True]
            assert await c.pin([ref]) == 1 and await c.unpin([ref]) == 1
            result = await c.generate("What colour is the sky?", chunks=[ref], mode="reuse", **SMALL)
            stream = c.generate_stream("What colour is the sky?", chunks=[ref], mode="reuse", **SMALL)
            pieces = [p async for p in stream]
            assert "".join(pieces) == stream.result.text == result.text  # greedy: same answer
            assert (await c.stats())["server"]["version"]
            with pytest.raises(RagKVError) as e:
                await c.generate("", chunks=[ref])
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert await c.evict([ref]) == 1

    asyncio.run(main())


@pytest.mark.parametrize("kwargs, code, field", [
    (dict(question=" "), "INVALID_ARGUMENT", "question"),
    (dict(chunks=[]), "INVALID_ARGUMENT", "chunks"),
    (dict(chunks=["x" * 32_001]), "INVALID_ARGUMENT", "chunks[0]"),
    (dict(recompute_ratio=1.5), "INVALID_ARGUMENT", "recompute_ratio"),
    (dict(recompute_ratio=-0.1), "INVALID_ARGUMENT", "recompute_ratio"),
    (dict(mode="turbo"), "INVALID_ARGUMENT", "mode"),
    (dict(max_new_tokens=0), "INVALID_ARGUMENT", "max_new_tokens"),
    (dict(compression=Compression("lru", 0.5)), "INVALID_ARGUMENT", "compression.policy"),
    (dict(compression=Compression("h2o", 1.5)), "INVALID_ARGUMENT", "compression.budget"),
    (dict(compression=Compression("h2o", 2)), "INVALID_ARGUMENT", "compression.budget"),  # below the protected set
    (dict(chunks=["0" * 64]), "NOT_FOUND", "chunks[0]"),
])
def test_invalid_generate(client, kwargs, code, field):
    args = dict(question=Q, chunks=CHUNKS[:1], **SMALL)
    args.update(kwargs)
    with pytest.raises(RagKVError) as e:
        client.generate(**args)
    assert e.value.code.name == code
    assert e.value.message.startswith(field + ":"), e.value.message


@pytest.mark.parametrize("call, field", [
    (lambda c: c.ingest([""]), "texts[0]"),
    (lambda c: c.ingest([]), "texts"),
    (lambda c: c.lookup(["not-an-id"]), "ids[0]"),
    (lambda c: c.pin(["A" * 64]), "ids[0]"),
])
def test_invalid_other_rpcs(client, call, field):
    with pytest.raises(RagKVError) as e:
        call(client)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.message.startswith(field + ":"), e.value.message


def _raw_generate(server):
    channel = grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", -1)])
    return channel, channel.unary_unary("/ragkv.v1.RagKV/Generate", request_serializer=lambda b: b,
                                        response_deserializer=pb.GenerateResponse.FromString)


def test_invalid_utf8_is_invalid_argument(client, server):
    good = pb.GenerateRequest(question="ok?", chunks=["fine", "XXXX"]).SerializeToString()
    bad = good.replace(b"XXXX", b"\xff\xfe\xfd\xfc")  # same length: the framing stays valid
    channel, generate = _raw_generate(server)
    with channel:
        with pytest.raises(grpc.RpcError) as e:
            generate(bad, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "chunks[1]: invalid UTF-8"
    assert client.health() == "SERVING"


def test_oversized_request_is_refused(server):
    channel = grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", -1)])
    ingest = channel.unary_unary("/ragkv.v1.RagKV/Ingest", request_serializer=pb.IngestRequest.SerializeToString,
                                 response_deserializer=pb.IngestResponse.FromString)
    with channel, pytest.raises(grpc.RpcError) as e:
        ingest(pb.IngestRequest(texts=["x" * (65 << 20)]), timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
