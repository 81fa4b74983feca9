"""Protobuf messages <-> engine request/result types. No policy here: validation lives in
workers.requests (raised as InvalidArgument) plus the few checks for RPCs that have no
request dataclass (ingest texts, chunk ids)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Sequence

from ragkv.errors import InvalidArgument
from ragkv.v1 import ragkv_pb2 as pb
from workers.requests import (
    MAX_CHUNK_CHARS,
    ChunkRef,
    CompressionSpec,
    GenerateRequest,
    GenerateResult,
    check_namespace,
    is_chunk_id,
)

MAX_INGEST_TEXTS = 1024
MAX_IDS = 4096

TYPED_STATS = ("chunks_hit", "chunks_computed", "recomputed_tokens", "prompt_tokens", "kv_bytes_loaded")


def compression_spec(msg: pb.Compression) -> CompressionSpec:
    kwargs: dict = {}
    if msg.policy:
        kwargs["policy"] = msg.policy
    which = msg.WhichOneof("budget")
    if which == "budget_fraction":
        kwargs["budget"] = float(msg.budget_fraction)
    elif which == "budget_tokens":
        kwargs["budget"] = int(msg.budget_tokens)
    decode = msg.WhichOneof("decode_budget")
    if decode == "decode_budget_fraction":
        kwargs["decode_budget"] = float(msg.decode_budget_fraction)
    elif decode == "decode_budget_tokens":
        kwargs["decode_budget"] = int(msg.decode_budget_tokens)
    for name in ("sink_tokens", "protect_system_prompt", "window"):
        if msg.HasField(name):
            kwargs[name] = getattr(msg, name)
    return CompressionSpec(**kwargs)


def ingest_compression(msg: pb.IngestRequest) -> CompressionSpec | None:
    """The ingest's compression spec, or None (absent: chunks are stored whole)."""
    return compression_spec(msg.compression) if msg.HasField("compression") else None


def generate_request(msg: pb.GenerateRequest) -> GenerateRequest:
    """Unset optional fields take the dataclass defaults; InvalidArgument on bad values."""
    kwargs: dict = {"question": msg.question, "chunks": tuple(msg.chunks), "system_prompt": msg.system_prompt,
                    "namespace": msg.namespace}
    if msg.mode:
        kwargs["mode"] = msg.mode
    for name in ("max_new_tokens", "recompute_ratio", "temperature", "top_p", "seed"):
        if msg.HasField(name):
            kwargs[name] = getattr(msg, name)
    if msg.HasField("compression"):
        kwargs["compression"] = compression_spec(msg.compression)
    return GenerateRequest(**kwargs)


def _jsonable(value):
    if isinstance(value, Mapping):  # dicts, and the typed stats (a Mapping over their JSON)
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return str(value)


def stats_json(stats: dict) -> str:
    return json.dumps(_jsonable(stats), sort_keys=True, allow_nan=True)


def generate_response(result: GenerateResult) -> pb.GenerateResponse:
    stats = dict(result.stats or {})
    typed = {name: max(0, int(stats.pop(name, 0) or 0)) for name in TYPED_STATS}
    return pb.GenerateResponse(
        text=result.text,
        token_ids=[int(t) for t in result.token_ids],
        prompt_token_ids=[int(t) for t in result.prompt_token_ids],
        ttft_s=float(result.ttft_s),
        total_s=float(result.total_s),
        stats=pb.GenerateStats(**typed, extra_json=stats_json(stats)),
    )


def chunk_refs(refs: Sequence[ChunkRef]) -> pb.IngestResponse:
    return pb.IngestResponse(chunks=[pb.ChunkRef(id=r.id, num_tokens=int(r.num_tokens), cached=bool(r.cached))
                                     for r in refs])


def namespace(value: str) -> str:
    return check_namespace(value)


def ingest_texts(msg: pb.IngestRequest) -> list[str]:
    texts = list(msg.texts)
    if not texts:
        raise InvalidArgument("texts", "at least one text is required")
    if len(texts) > MAX_INGEST_TEXTS:
        raise InvalidArgument("texts", f"at most {MAX_INGEST_TEXTS} texts per request, got {len(texts)}")
    for i, text in enumerate(texts):
        if not text.strip():
            raise InvalidArgument(f"texts[{i}]", "must not be empty")
        if len(text) > MAX_CHUNK_CHARS:
            raise InvalidArgument(f"texts[{i}]", f"longer than {MAX_CHUNK_CHARS} characters")
    namespace(msg.namespace)
    return texts


def chunk_ids(ids: Sequence[str]) -> list[str]:
    ids = list(ids)
    if len(ids) > MAX_IDS:
        raise InvalidArgument("ids", f"at most {MAX_IDS} ids per request, got {len(ids)}")
    for i, chunk_id in enumerate(ids):
        if not is_chunk_id(chunk_id):
            raise InvalidArgument(f"ids[{i}]", f"not a chunk id (64 lowercase hex characters): {chunk_id[:80]!r}")
    return ids
