"""Chunks compressed at ingest: the block round trip through every backend, the content address, fusing
at an offset (dropped entries stay invisible, blend never revives them), and every mode through the engine."""

from __future__ import annotations

import pytest
import torch

from kvstore.backends.memory import MemoryTier
from kvstore.backends.registry import open_backend
from kvstore.block import decode_block, encode_block
from kvstore.codecs import DEFAULT_CODEC, make_codec
from kvstore.store import BlockStore
from workers.blend import COMPRESSED_METHOD, BlendConfig, fuse_chunks, recompute
from workers.engine import Engine, EngineConfig
from workers.errors import InvalidArgument, NotFound
from workers.eviction.chunks import compact, compress_chunk, compression_json
from workers.prompt import build_prompt
from workers.requests import CompressionSpec, GenerateRequest, mode_names

# these tests compare answers over the same chunks run twice: an idle-time exact prefill of a blended prompt
# (workers/sequences.py) would make the second exact; tests/workers/test_sequences.py covers that
SEQ = False

TEXT = ("The grass is green. The sky is blue. The pass key is 71942. Remember it. The sun is yellow. "
        "Here we go. There and back again.")
OTHER = "Paris is the capital of France. Bananas are yellow. Mount Everest is 8849 metres tall."
SPEC = CompressionSpec(policy="kvzip", budget=0.3)

@pytest.fixture(scope="module")
def compressed(runner):
    kv = runner.chunk_kv(runner.tokenize(TEXT))
    small, stats = compress_chunk(runner, kv, SPEC)
    return kv, small, stats


def test_compress_chunk_keeps_the_budget_per_layer_and_head(runner, compressed):
    kv, small, stats = compressed
    n = kv.num_tokens
    assert small.compression == compression_json(SPEC) and small.token_ids == kv.token_ids
    counts = small.head_mask.sum(dim=2)  # [L, Hkv]
    assert int(counts.sum()) == SPEC.budget_tokens(n) * runner.shape.num_layers * runner.shape.num_kv_heads
    assert len(set(counts.sum(dim=1).tolist())) > 1  # non-uniform across layers
    assert bool(small.head_mask[:, :, :4].all()) and bool((small.positions[:, :, :4] == torch.arange(4)).all())  # sinks
    assert stats["kv_bytes_after"] < 0.5 * stats["kv_bytes_before"]
    assert not bool((counts == counts[:, :1]).all())  # at ingest the heads of a layer compete (no cap)
    # kept entries are exactly the chunk's own K/V at their positions
    layer, head, slot = small.head_mask.nonzero(as_tuple=True)
    pos = small.positions[layer, head, slot]
    torch.testing.assert_close(small.values[layer, head, slot], kv.values[layer, head, pos].to(small.values.dtype))
    # the same chunk compressed again (alone, any time) keeps the same set: the score ignores any question
    again, _ = compress_chunk(runner, kv, SPEC)
    assert torch.equal(again.positions, small.positions) and torch.equal(again.head_mask, small.head_mask)


@pytest.mark.parametrize("codec", ["fp16", DEFAULT_CODEC])
def test_block_round_trip(compressed, codec):
    _, small, _ = compressed
    data = encode_block(small, make_codec(codec), "fp")
    back, header = decode_block(data, expected_fingerprint="fp")
    assert header.compression == small.compression and back.compression == small.compression
    assert torch.equal(back.positions, small.positions) and torch.equal(back.head_mask, small.head_mask)
    assert back.token_ids == small.token_ids and back.keys.shape == small.keys.shape
    if codec == "fp16":
        torch.testing.assert_close(back.keys.float(), small.keys.float(), atol=1e-2, rtol=1e-2)
    damaged = bytearray(data)
    damaged[-20] ^= 0xFF  # inside the positions section
    with pytest.raises(Exception):
        decode_block(bytes(damaged))


@pytest.fixture(params=["disk", "redis", "memory"])
def backend(request, tmp_path):
    if request.param == "disk":
        yield open_backend(f"disk:{tmp_path / 'blocks'}")
    elif request.param == "redis":
        yield open_backend(request.getfixturevalue("redis_url"))
    else:
        yield MemoryTier(open_backend(f"disk:{tmp_path / 'inner'}"), 64 << 20)


def test_round_trip_through_every_backend(compressed, backend):
    _, small, _ = compressed
    store = BlockStore(backend, "fp16", "fp")
    address = store.address_for(small.token_ids, "ns")
    assert store.put(small, address)
    back = store.get(address, small.token_ids)
    assert back is not None and back.compression == small.compression
    assert torch.equal(back.positions, small.positions) and torch.equal(back.head_mask, small.head_mask)
    assert store.get_header(address).compression == small.compression
    store.close()


def test_fused_compressed_chunk_is_masked_and_never_revived(runner, compressed):
    kv, small, _ = compressed
    layout = build_prompt(runner.tokenizer, "", [kv.token_ids], "What is the pass key?")
    prefix = runner.chunk_kv(layout.prefix_ids)
    cache, computed = fuse_chunks(runner, layout, prefix, [small])
    start, end = layout.chunk_spans[0]
    masks = [c.head_mask.clone() for c in cache.layers]
    for i, m in enumerate(masks):  # only the kept entries of the chunk's span are visible
        assert int(m[:, start:end].sum()) == int(small.head_mask[i].sum())
        assert bool(m[:, :start].all()) and bool(m[:, end:].all())
    recompute(runner, layout, cache, computed, BlendConfig(recompute_ratio=1.0))  # recompute everything
    assert all(torch.equal(c.head_mask, m) for c, m in zip(cache.layers, masks))
    before = cache.nbytes()
    compact(cache)
    assert cache.nbytes() < before
    for i, c in enumerate(cache.layers):  # compacted: every head holds its kept chunk slots + all others
        for h in range(c.head_mask.shape[0] if c.head_mask is not None else 1):
            positions = c.positions if c.positions.dim() == 1 else c.positions[h]
            held = {int(p) for p in positions[c.head_mask[h]]} if c.head_mask is not None else set(range(len(
                layout.token_ids)))
            kept = {start + int(p) for p in small.positions[i, h][small.head_mask[i, h]]}
            assert held == set(range(start)) | kept | set(range(end, layout.num_tokens))
        if c.head_mask is not None and not bool(c.head_mask.all()):  # unequal counts: packed, the visible entries
            assert c.packed and c.keys.shape[1] == int(masks[i].sum())
    assert any(c.packed for c in cache.layers)


@pytest.fixture(scope="module")
def engine(runner, tmp_path_factory):
    # blend over plain chunks too (a server's own setting serves the default ratio exactly, reading no chunk)
    eng = Engine(EngineConfig(store=f"disk:{tmp_path_factory.mktemp('cc') / 'b'}", sequence_cache=SEQ,
                              blend=BlendConfig()), runner=runner)
    yield eng
    eng.close()


def test_engine_ingest_compressed_and_every_mode(engine):
    plain = engine.ingest([TEXT, OTHER])
    small = engine.ingest([TEXT, OTHER], compression=SPEC)
    assert [r.id for r in small] != [r.id for r in plain] and not any(r.cached for r in small)
    assert [r.num_tokens for r in small] == [r.num_tokens for r in plain]
    again = engine.ingest([OTHER, TEXT], compression=SPEC)  # alone or with others: the same block
    assert [r.id for r in again] == [small[1].id, small[0].id] and all(r.cached for r in again)
    other_budget = engine.ingest([TEXT], compression=CompressionSpec(policy="kvzip", budget=0.5))
    assert other_budget[0].id not in {r.id for r in small}  # the spec is part of the address
    stored = [len(engine.store.get_raw(r.id)) for r in small]
    assert all(s < len(engine.store.get_raw(p.id)) for s, p in zip(stored, plain))
    q = "What is the pass key?"
    for mode in mode_names():
        by_small = engine.generate(GenerateRequest(question=q, chunks=tuple(r.id for r in small), mode=mode,
                                                   max_new_tokens=6))
        by_plain = engine.generate(GenerateRequest(question=q, chunks=tuple(r.id for r in plain), mode=mode,
                                                   max_new_tokens=6))
        assert by_small.prompt_token_ids == by_plain.prompt_token_ids
        if mode in ("full", "prefix"):  # recomputed from the tokens: the compression plays no part
            assert by_small.token_ids == by_plain.token_ids
        else:
            assert by_small.stats["compressed_chunks"] == 2 and by_small.stats["chunks_hit"] == 2
            assert by_small.stats["kv_bytes_final"] < by_plain.stats["kv_bytes_final"]
            # decoded chunk KV is padded to its longest (layer, head) row: never more than the whole chunk
            assert by_small.stats["kv_bytes_loaded"] <= by_plain.stats["kv_bytes_loaded"]
    # a request-time policy on top of compressed chunks
    both = engine.generate(GenerateRequest(question=q, chunks=tuple(r.id for r in small), mode="blend",
                                           max_new_tokens=4, compression=CompressionSpec(policy="snapkv", budget=0.5)))
    assert both.stats["compression"]["kv_bytes_after"] < both.stats["compression"]["kv_bytes_before"]
    with pytest.raises(NotFound):  # ids are per namespace, compressed or not
        engine.generate(GenerateRequest(question=q, chunks=(small[0].id,), namespace="elsewhere"))


@pytest.mark.parametrize("policy", ["snapkv", "h2o", "tova", "streaming", "adakv", "pyramidkv"])
def test_question_dependent_policy_at_ingest_is_invalid(engine, policy):
    with pytest.raises(InvalidArgument) as err:
        engine.ingest([TEXT], compression=CompressionSpec(policy=policy, budget=0.3))
    assert err.value.field == "compression.policy"


def test_bad_budget_at_ingest_is_invalid(engine):
    with pytest.raises(InvalidArgument) as err:
        engine.ingest([TEXT], compression=CompressionSpec(policy="kvzip", budget=2))  # below the 4 sinks
    assert err.value.field == "compression.budget"


def test_engine_with_a_pre_rope_codec_ingests_compressed_chunks(runner, tmp_path):
    """A pre-RoPE codec (the default wk4v3 stores pre-RoPE keys) serves chunks compressed at ingest: reuse, and
    blend at a requested ratio (which recomputes over them with the compressed-chunk method). The default
    blend over them recomputes nothing and adds the context drift. Whether the answer survives is measured
    by the quality suite, not asserted here (a 135M model's answer depends on the CPU's kernels)."""
    eng = Engine(EngineConfig(store=f"disk:{tmp_path / 'b'}", codec="wk4v3"), runner=runner)
    try:
        assert eng.store.codec.pre_rope
        small = eng.ingest([TEXT, OTHER], compression=CompressionSpec(policy="kvzip", budget=0.5))
        ids = tuple(r.id for r in small)
        for mode, ratio in (("reuse", None), ("blend", 0.15)):
            out = eng.generate(GenerateRequest(question="What is the pass key?", chunks=ids, mode=mode,
                                               max_new_tokens=12, recompute_ratio=ratio))
            assert out.stats["compressed_chunks"] == 2 and out.stats["chunks_hit"] == 2
            assert out.token_ids  # what it answers is the quality suite's to measure (`ingest:kvzip@0.5`)
        # a requested ratio runs the method for compressed chunks there (gradual loses over them, README)
        assert out.stats["blend_method"] == COMPRESSED_METHOD != BlendConfig().method
        assert out.stats["recomputed_tokens"] > 0 and out.stats["blend_setting"] == "request"
        out = eng.generate(GenerateRequest(question="What is the pass key?", chunks=ids, max_new_tokens=12))
        assert out.stats["recomputed_tokens"] == 0 and out.stats["context_drift"]
        assert out.stats["recompute_ratio"] == BlendConfig().compressed_ratio == 0.0
    finally:
        eng.close()
