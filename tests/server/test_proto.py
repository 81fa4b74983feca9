"""The committed stubs are what `python -m ragkv.tools.gen_proto` generates from proto/."""

from __future__ import annotations

import re

from ragkv.tools.gen_proto import GENERATED, REPO_ROOT, generate

# Lines that only record the generator's version: a newer grpcio-tools on a fresh machine may differ there.
VERSION_LINES = re.compile(r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s+\d+,)$", re.M)


def _normalized(text: str) -> str:
    return VERSION_LINES.sub("<version>", text)


def test_committed_stubs_are_up_to_date(tmp_path):
    generate(tmp_path)
    for name in GENERATED:
        fresh, committed = (tmp_path / name).read_text(), (REPO_ROOT / name).read_text()
        assert _normalized(fresh) == _normalized(committed), f"{name} is stale: run `python -m ragkv.tools.gen_proto`"


def test_service_shape():
    from ragkv.v1 import ragkv_pb2

    service = ragkv_pb2.DESCRIPTOR.services_by_name["RagKV"]
    assert service.full_name == "ragkv.v1.RagKV"
    assert set(service.methods_by_name) == {"Ingest", "Generate", "GenerateStream", "Lookup", "Pin", "Unpin",
                                            "Evict", "Stats"}
    assert service.methods_by_name["GenerateStream"].server_streaming
