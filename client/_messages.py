"""Arguments -> request messages, response messages -> SDK types (shared by the sync and async clients)."""

from __future__ import annotations

import json
from typing import Iterable, Sequence

from client.types import ChunkRef, Compression, GenerateResult
from ragkv.v1 import ragkv_pb2 as pb

TYPED_STATS = ("chunks_hit", "chunks_computed", "recomputed_tokens", "prompt_tokens", "kv_bytes_loaded")


def _chunk(c) -> str:
    return c.id if isinstance(c, ChunkRef) else c


def ids(values: Iterable) -> list[str]:
    if isinstance(values, (str, ChunkRef)):
        values = [values]
    return [_chunk(v) for v in values]


def compression(c: Compression) -> pb.Compression:
    msg = pb.Compression(policy=c.policy, sink_tokens=c.sink_tokens, protect_system_prompt=c.protect_system_prompt)
    if isinstance(c.budget, float):
        msg.budget_fraction = c.budget
    else:
        msg.budget_tokens = c.budget
    if c.window is not None:
        msg.window = c.window
    if isinstance(c.decode_budget, float):
        msg.decode_budget_fraction = c.decode_budget
    elif c.decode_budget is not None:
        msg.decode_budget_tokens = c.decode_budget
    return msg


def ingest_request(texts, pin: bool, namespace: str, compression_: Compression | None) -> pb.IngestRequest:
    if isinstance(texts, str):
        texts = [texts]
    msg = pb.IngestRequest(texts=list(texts), pin=pin, namespace=namespace)
    if compression_ is not None:
        msg.compression.CopyFrom(compression(compression_))
    return msg


def generate_request(question: str, chunks: Sequence = (), system_prompt: str = "", max_new_tokens: int = 64,
                     mode: str = "blend", recompute_ratio: float | None = None, compression_: Compression | None = None,
                     temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
                     namespace: str = "") -> pb.GenerateRequest:
    if isinstance(chunks, (str, ChunkRef)):
        chunks = [chunks]
    msg = pb.GenerateRequest(question=question, chunks=[_chunk(c) for c in chunks], system_prompt=system_prompt,
                             max_new_tokens=max_new_tokens, mode=mode, namespace=namespace)
    if compression_ is not None:
        msg.compression.CopyFrom(compression(compression_))
    for name, value in (("recompute_ratio", recompute_ratio), ("temperature", temperature), ("top_p", top_p),
                        ("seed", seed)):
        if value is not None:
            setattr(msg, name, value)
    return msg


def generate_result(msg: pb.GenerateResponse) -> GenerateResult:
    stats = json.loads(msg.stats.extra_json) if msg.stats.extra_json else {}
    stats.update({name: getattr(msg.stats, name) for name in TYPED_STATS})
    return GenerateResult(text=msg.text, token_ids=list(msg.token_ids), prompt_token_ids=list(msg.prompt_token_ids),
                          ttft_s=msg.ttft_s, total_s=msg.total_s, stats=stats)


def chunk_refs(msg: pb.IngestResponse) -> list[ChunkRef]:
    return [ChunkRef(id=c.id, num_tokens=c.num_tokens, cached=c.cached) for c in msg.chunks]


def stats(msg: pb.StatsResponse) -> dict:
    s = msg.server
    return {"server": {"version": s.version, "uptime_s": s.uptime_s, "in_flight": s.in_flight, "queued": s.queued,
                       "max_queue": s.max_queue},
            "engine": json.loads(msg.engine_json) if msg.engine_json else {}}
