"""The SDK's Compression on the wire: ingest compression and the decode budget (extended, never renamed)."""

from __future__ import annotations

import pytest

from client import Compression
from client import _messages
from ragkv.server import convert


def test_ingest_request_carries_compression_and_round_trips_to_the_spec():
    msg = _messages.ingest_request(["a", "b"], False, "", Compression("kvzip", budget=0.3))
    assert msg.HasField("compression") and msg.compression.policy == "kvzip"
    spec = convert.ingest_compression(msg)
    assert spec.policy == "kvzip" and spec.budget == 0.3 and spec.decode_budget is None
    assert convert.ingest_compression(_messages.ingest_request("a", True, "ns", None)) is None


@pytest.mark.parametrize("decode_budget", [None, 0.5, 64])
def test_decode_budget_forms(decode_budget):
    msg = _messages.compression(Compression("snapkv", budget=0.2, decode_budget=decode_budget))
    assert convert.compression_spec(msg).decode_budget == decode_budget
    assert type(convert.compression_spec(msg).decode_budget) is type(decode_budget)


def test_decode_budget_type_is_checked_client_side():
    with pytest.raises(TypeError):
        Compression("snapkv", budget=0.2, decode_budget="lots")
