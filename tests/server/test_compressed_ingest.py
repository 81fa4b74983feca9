"""Chunks compressed at ingest and decode budgets through the SDK, against a real `ragkv serve`."""

from __future__ import annotations

import grpc
import pytest
from conftest import CHUNKS

from client import Compression, RagKVError

Q = "What is the capital of France?"


def test_ingest_compressed_then_every_mode(client, refs):
    small = client.ingest(CHUNKS, compression=Compression("kvzip", budget=0.5))
    assert [r.num_tokens for r in small] == [r.num_tokens for r in refs]
    assert {r.id for r in small}.isdisjoint({r.id for r in refs})  # the spec is part of the address
    again = client.ingest(CHUNKS[:1], compression=Compression("kvzip", budget=0.5))
    assert again[0].id == small[0].id and again[0].cached
    assert client.ingest(CHUNKS[:1], compression=Compression("kvzip", budget=0.8))[0].id != small[0].id
    assert client.lookup([r.id for r in small]) == [True] * len(small)
    for mode in ("full", "prefix", "reuse", "blend"):
        result = client.generate(Q, chunks=small[:2], mode=mode, max_new_tokens=4)
        stored = mode in ("reuse", "blend")
        assert result.token_ids and result.stats["chunks_hit"] == (2 if stored else 0)
        if stored:
            assert result.stats["compressed_chunks"] == 2


@pytest.mark.parametrize("policy", ["snapkv", "h2o", "tova"])
def test_question_dependent_policy_at_ingest_is_invalid_argument(client, policy):
    with pytest.raises(RagKVError) as err:
        client.ingest(CHUNKS[:1], compression=Compression(policy, budget=0.5))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "compression.policy" in err.value.message


def test_bad_ingest_budget_is_invalid_argument(client):
    with pytest.raises(RagKVError) as err:
        client.ingest(CHUNKS[:1], compression=Compression("kvzip", budget=1.5))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "compression.budget" in err.value.message


def test_decode_budget_through_the_wire(client, refs):
    appended = client.generate(Q, chunks=refs[:2], mode="blend", max_new_tokens=6,
                               compression=Compression("snapkv", budget=0.6))
    bounded = client.generate(Q, chunks=refs[:2], mode="blend", max_new_tokens=6,
                              compression=Compression("snapkv", budget=0.6, decode_budget=0.6))
    assert appended.stats["compression"]["decode_budget_tokens"] is None
    assert appended.stats["compression"]["phase"] == "prefill"
    assert bounded.stats["compression"]["decode_budget_tokens"] == bounded.stats["compression"]["budget_tokens"]
    with pytest.raises(RagKVError) as err:
        client.generate(Q, chunks=refs[:1], compression=Compression("h2o", budget=0.6, decode_budget=0))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "compression.decode_budget" in err.value.message
