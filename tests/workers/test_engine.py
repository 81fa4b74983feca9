"""The engine end to end on the real model and a real store: modes, cache hits, ids, errors.

The suite runs against both EngineProtocol implementations: `Engine` in process and `RayEngine`
(one actor on a real local Ray over the session's redis-server), so the two cannot drift apart.
"""

import threading
import time
import uuid

import pytest
import torch

from ragkv.errors import Cancelled, InvalidArgument, NotFound
from workers.batching.scheduler import BatchConfig
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.prompt import build_prompt
from workers.requests import GenerateRequest, mode_names

# these tests compare answers over the same chunks run twice: an idle-time exact prefill of a blended prompt
# (workers/sequences.py) would make the second exact; tests/workers/test_sequences.py covers that
SEQ = False
# the exact kernels on every CPU: `full` is compared with transformers' fp32 `generate` token for token, a claim
# only the fp32 prefill and decode make (`auto` is bf16 on AVX512-BF16/AMX; the default decode kernel is int4)
EXACT = dict(prefill_kernel="fp32", batch=BatchConfig(decode_kernel="fp32"))
# these tests exercise CacheBlend over stored chunks; a server's own setting serves the default ratio by an exact
# prefill instead (workers/blend.py server_setting, covered in tests/workers/test_sequences.py): blend at any ratio
BLENDED = BlendConfig()

CHUNKS = [
    "The capital of Frobnia is Lindorf. Lindorf was founded in 1432 by the salt merchant Osric Vale.",
    "Zorblat is a cold planet with two moons, Tiv and Rel, and oceans of liquid methane.",
    "Brightwell Robotics makes greenhouse robots; its chief executive is Lorna Featherstone.",
]
QUESTION = "Who founded Lindorf?"


def _engine(request, runner, tmp_path, backend: str):
    store = f"disk:{tmp_path / 'blocks'}" if backend == "disk" else request.getfixturevalue("redis_url")
    return Engine(EngineConfig(store=store, codec="kivi2", sequence_cache=SEQ, blend=BLENDED, **EXACT), runner=runner)


@pytest.fixture
def engine(request, runner, tmp_path):
    eng = _engine(request, runner, tmp_path, "disk")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def ray_pool(ray_local, redis_server):
    """One worker actor (it loads its own model) over the session's redis-server."""
    from workers.ray_pool import WorkerPool

    pool = WorkerPool(EngineConfig(store=redis_server.url, codec="kivi2", memory_budget_bytes=None, sequence_cache=SEQ,
                                   blend=BLENDED, **EXACT), num_workers=1)
    yield pool
    pool.shutdown()


def _ray_engine(request):
    from workers.ray_pool import RayEngine

    request.getfixturevalue("redis_url")  # a clean database
    pool = request.getfixturevalue("ray_pool")
    return RayEngine(pool.config, pool)


@pytest.fixture(params=["disk", "redis", "ray"])
def any_engine(request, runner, tmp_path):
    """The same behaviour over both backends, and from RayEngine."""
    eng = _ray_engine(request) if request.param == "ray" else _engine(request, runner, tmp_path, request.param)
    yield eng
    eng.close()


@pytest.fixture(params=["Engine", "RayEngine"])
def each_engine(request, runner, tmp_path):
    """Engine and RayEngine: the same suite against both implementations of workers.protocol.EngineProtocol."""
    eng = _ray_engine(request) if request.param == "RayEngine" else _engine(request, runner, tmp_path, "disk")
    yield eng
    eng.close()


def test_second_request_hits_cached_chunks(any_engine):
    engine = any_engine
    first = engine.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS, mode="blend", max_new_tokens=12))
    assert first.stats["chunks_computed"] == 3 and first.stats["chunks_hit"] == 0
    second = engine.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS, mode="blend", max_new_tokens=12))
    assert second.stats["chunks_hit"] == 3 and second.stats["chunks_computed"] == 0
    assert second.stats["kv_bytes_loaded"] > 0 and second.stats["prefix_hit"]
    assert second.prompt_token_ids == first.prompt_token_ids
    assert second.token_ids == first.token_ids  # a miss serves the block as a hit will decode it


def test_all_modes_share_prompt_ids_and_full_equals_transformers(each_engine, runner):
    engine = each_engine
    engine.ingest(CHUNKS)
    # blend first, in a namespace of its own: an exact prefill (full, prefix) stores the chunk sequence, and a
    # later blend over the same chunks reads it exactly (tests/workers/test_sequences.py), recomputing nothing
    namespace = f"modes-{uuid.uuid4().hex}"
    modes = sorted(mode_names(), key=lambda m: m != "blend")
    results = {m: engine.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS, mode=m, max_new_tokens=12,
                                                  namespace=namespace)) for m in modes}
    ids = results["full"].prompt_token_ids
    assert all(r.prompt_token_ids == ids for r in results.values())
    with torch.inference_mode():
        ref = runner.model.generate(torch.tensor(ids)[None], max_new_tokens=12, do_sample=False)[0, len(ids):]
    ref = [t for t in ref.tolist() if t not in runner.stop_token_ids]
    assert results["full"].token_ids == ref
    assert all(r.text and r.stats["mode"] == m for m, r in results.items())
    assert results["reuse"].stats["recomputed_tokens"] == 0 and not results["reuse"].stats["context_drift"]
    assert set(results["blend"].stats["breakdown"]) >= {"queue", "load", "fuse", "layers", "logits"}
    assert 0 < results["blend"].stats["recomputed_tokens"] < results["full"].stats["recomputed_tokens"]


def test_the_breakdown_tells_preparing_the_prompt_from_waiting_for_the_scheduler(engine):
    """`prompt`: chunks tokenized and the prompt laid out on the caller's thread; `queue`: submitted while the
    scheduler was busy (here with a 0.5 s call); with the prefill's parts they stay within the time to the first
    token."""
    busy = threading.Event()
    other = threading.Thread(target=lambda: engine.scheduler.call(lambda: (busy.set(), time.sleep(0.5))))
    other.start()
    assert busy.wait(10)
    result = engine.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS[:2], mode="reuse", max_new_tokens=2))
    other.join()
    parts = result.stats["breakdown"]
    assert parts["queue"] >= 0.2 and 0 < parts["prompt"] < parts["queue"]
    assert result.stats["queued_s"] == parts["queue"] and result.stats["prompt_s"] == parts["prompt"]
    assert sum(parts.values()) <= result.stats["prefill_s"] + 1e-6


def test_ingest_ids_are_content_addresses_and_usable_by_id(any_engine):
    engine = any_engine
    refs = engine.ingest(CHUNKS[:2])
    assert [r.cached for r in refs] == [False, False]
    again = engine.ingest(CHUNKS[:2])
    assert [r.id for r in again] == [r.id for r in refs] and all(r.cached for r in again)
    assert engine.lookup([refs[0].id, "0" * 64]) == [True, False]
    by_text = engine.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS[:2], max_new_tokens=6))
    by_id = engine.generate(GenerateRequest(question=QUESTION, chunks=[r.id for r in refs], max_new_tokens=6))
    assert by_id.token_ids == by_text.token_ids


def test_unknown_chunk_id_is_not_found(each_engine):
    engine = each_engine
    with pytest.raises(NotFound, match="chunks\\[0\\]"):
        engine.generate(GenerateRequest(question=QUESTION, chunks=["ab" * 32]))


def test_invalid_requests_name_the_field():
    with pytest.raises(InvalidArgument, match="question"):
        GenerateRequest(question=" ", chunks=["x"])
    with pytest.raises(InvalidArgument, match="chunks"):
        GenerateRequest(question="q", chunks=[])
    with pytest.raises(InvalidArgument, match="recompute_ratio"):
        GenerateRequest(question="q", chunks=["x"], recompute_ratio=1.5)
    with pytest.raises(InvalidArgument, match="mode"):
        GenerateRequest(question="q", chunks=["x"], mode="fast")


def test_a_chunk_text_seen_before_gives_the_same_ids_without_sharing_them(engine, runner):
    """Chunk texts' token ids are kept (bounded, short texts only): the same ids as tokenizing, a fresh list each
    time, and the limits still apply to a long text, which is not kept."""
    first = engine.tokenize_chunk(CHUNKS[0], "chunks[0]")
    first.append(-1)  # the caller's list: the kept ids are not touched
    assert engine.tokenize_chunk(CHUNKS[0], "chunks[0]") == runner.tokenize(CHUNKS[0])
    long = "lorem ipsum dolor sit amet " * 1000  # over the token limit and over the kept length
    with pytest.raises(InvalidArgument, match="chunks\\[3\\].*over the limit"):
        engine.tokenize_chunk(long, "chunks[3]")
    with pytest.raises(InvalidArgument, match="chunks\\[1\\]"):
        engine.tokenize_chunk("", "chunks[1]")


def test_streaming_pieces_join_to_the_text(each_engine):
    engine = each_engine
    request = GenerateRequest(question=QUESTION, chunks=CHUNKS, max_new_tokens=10)
    items = list(engine.generate_stream(request))
    pieces, result = items[:-1], items[-1]
    assert all(isinstance(p, str) for p in pieces) and "".join(pieces) == result.text


def test_compression_through_the_engine(runner, tmp_path):
    from workers.requests import CompressionSpec

    eng = Engine(EngineConfig(store=f"disk:{tmp_path / 'b'}"), runner=runner)
    plain = eng.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS, mode="blend", max_new_tokens=4))
    spec = CompressionSpec(policy="snapkv", budget=0.5)
    squeezed = eng.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS, mode="blend", max_new_tokens=4,
                                            compression=spec))
    stats = squeezed.stats["compression"]
    assert stats["kv_bytes_after"] < stats["kv_bytes_before"]
    assert squeezed.stats["kv_bytes_final"] < plain.stats["kv_bytes_final"]
    with pytest.raises(InvalidArgument, match="compression.budget"):
        eng.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS, compression=CompressionSpec("h2o", budget=8)))
    eng.close()


def test_ingest_recomputes_a_damaged_block_instead_of_calling_it_cached(engine):
    [ref] = engine.ingest(CHUNKS[:1])
    raw = bytearray(engine.store.get_raw(ref.id))
    raw[len(raw) // 2] ^= 0xFF
    engine.store.put_raw(ref.id, bytes(raw))
    [again] = engine.ingest(CHUNKS[:1])
    assert again.id == ref.id and not again.cached
    assert engine.store.get(ref.id) is not None  # stored whole again


def test_should_stop_cancels(each_engine):
    with pytest.raises(Cancelled):
        each_engine.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS[:1], max_new_tokens=8),
                             should_stop=lambda: True)


def test_prefix_mode_is_exact_prefix_reuse(runner, tmp_path):
    """The stored system-prompt prefix is the prompt's real start (computed alone, never in the chunk form:
    `lead` would put a second copy of the template before it) and is stored losslessly, so `prefix` mode's
    logits are full prefill's within fp32 rounding (the two paths run the same kernels, but the prefix rows
    go through a separate matmul, so they are not claimed bit-identical)."""
    engine = Engine(EngineConfig(store=f"disk:{tmp_path / 'blocks'}", chunk_form="lead", prefill_kernel="fp32"),
                    runner=runner)
    try:
        for question in (QUESTION, "What are the moons of Zorblat?"):
            layout = build_prompt(runner.tokenizer, "", [runner.tokenize(c) for c in CHUNKS], question)
            source = engine.chunks.for_request("", [None] * len(CHUNKS), lambda: False)
            full = run_prefill(engine.runner, layout, plan_for("full", BlendConfig()))
            prefix = run_prefill(engine.runner, layout, plan_for("prefix", BlendConfig()), source)
            scale = full.logits.abs().max()
            assert float((prefix.logits - full.logits).abs().max() / scale) < 1e-4
            assert prefix.stats.recomputed_tokens == layout.num_tokens - layout.prefix_len
        assert prefix.stats.prefix_hit  # the second prompt reads the first one's stored prefix
        out = engine.generate(GenerateRequest(question=QUESTION, chunks=CHUNKS, mode="prefix", max_new_tokens=2))
        assert out.stats["prefix_hit"] and out.stats["mode"] == "prefix"
    finally:
        engine.close()

