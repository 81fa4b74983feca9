"""Context drift (workers/context_drift.py): the shift's math, its place in blend, and the stored measurement."""

from __future__ import annotations

import json

from dataclasses import replace

import pytest
import torch

from kvstore.kv import ChunkKV
from workers import context_drift as cd
from workers.blend import COMPRESSED_METHOD, BlendConfig, fuse_chunks, recompute
from workers.cache import KVCache
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.prompt import build_prompt
from workers.rope import rerotate_keys
from workers.selfcheck import CHECK_TEXTS


def random_drift(layers: int, heads: int, dim: int, scale: float, seed: int = 0) -> cd.ContextDrift:
    g = torch.Generator().manual_seed(seed)
    return cd.ContextDrift(keys=torch.randn(2, layers, heads, dim, generator=g) * scale,
                           values=torch.randn(2, layers, heads, dim, generator=g) * scale)


@pytest.mark.parametrize("pre_rope", [False, True])
def test_a_drifted_chunk_placed_anywhere_holds_its_keys_shifted_before_rope(pre_rope):
    """Placed at `start`, a drifted chunk's key i is R(start + i) (pre-RoPE key + the slot's drift), from either
    key form; values take the drift as it is; the chunk given is not written."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    g = torch.Generator().manual_seed(1)
    keys, values = torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 3, 5, 8, generator=g)  # [L, H, T, D] at 0..4
    chunk = ChunkKV(keys.clone(), values.clone(), list(range(5)), inv_freq=inv_freq).with_rope(pre_rope)
    before = chunk.keys.clone()
    drift = random_drift(2, 3, 8, 1.0)
    for slot in (0, 1):
        shifted = cd.drifted(chunk, slot, drift)
        placed = shifted.keys_at(40)
        for i in range(5):
            pre = rerotate_keys(keys[:, :, i:i + 1], -i, inv_freq)  # [L, H, 1, D]
            expected = rerotate_keys(pre + drift.keys[slot][:, :, None], 40 + i, inv_freq)
            torch.testing.assert_close(placed[:, :, i:i + 1], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(shifted.values, values + drift.values[slot][:, :, None])
    assert torch.equal(chunk.keys, before) and torch.equal(chunk.values, values)


def test_only_the_prompts_first_chunk_takes_the_first_slot():
    assert cd.chunk_slots(3, first=True) == [0, 1, 1]
    assert cd.chunk_slots(3, first=False) == [1, 1, 1]  # after an exact head, no placed chunk is the prompt's first


def shift_by_hand(cache: KVCache, layout, drift: cd.ContextDrift, inv_freq: torch.Tensor) -> None:
    """The drift added to a fused cache entry by entry, as the shift was first written: every stored chunk entry
    of layer l, its key un-rotated, shifted, rotated back; its value shifted."""
    for j, (start, end) in enumerate(layout.chunk_spans):
        slot = min(j, 1)
        positions = torch.arange(start, end)
        for layer, kv in enumerate(cache.layers):
            pre = rerotate_keys(kv.keys[:, start:end], -positions, inv_freq)  # [H, T, D]
            kv.keys[:, start:end] = rerotate_keys(pre + drift.keys[slot, layer][:, None], positions, inv_freq)
            kv.values[:, start:end] += drift.values[slot, layer][:, None]


def _prompt(runner):
    chunks = [runner.tokenize(text) for text in CHECK_TEXTS]
    layout = build_prompt(runner.tokenizer, "", chunks, "What did the lighthouse keeper count?")
    return layout, runner.chunk_kv(layout.prefix_ids), [runner.chunk_kv(c) for c in chunks]


FORM = "random-drift-test"  # a chunk form name whose drift the `drift` fixture sets (pipeline reads it by form)


@pytest.fixture
def drift(runner, monkeypatch):
    shape = runner.shape
    value = random_drift(shape.num_layers, shape.num_kv_heads, shape.head_dim, 0.5)
    monkeypatch.setitem(cd._DRIFTS, (runner.fingerprint, FORM), value)
    return value


def _blend(runner, layout, prefix, chunks, config, mode="blend", shift=None):
    """(logits, stats dict) of `mode` through the prefill pipeline; `shift` overrides the plan's."""
    plan = plan_for(mode, config)
    plan = plan if shift is None else replace(plan, shift=shift)
    out = run_prefill(runner, layout, plan, HeldChunks(prefix, chunks), chunk_form=FORM)
    return out.logits, out.stats.as_dict()


def _reuse_over(runner, layout, cache, computed):
    """Plain reuse's logits over a cache the test prepared (e.g. shifted by hand)."""
    return runner.logits(recompute(runner, layout, cache, computed, None).hidden)


def test_blend_with_context_drift_keeps_ratio_one_and_ratio_zero(runner, drift):
    layout, prefix, chunks = _prompt(runner)
    shape = runner.shape
    on = BlendConfig(context_drift=True)
    full = runner.forward(torch.tensor(layout.token_ids), torch.arange(layout.num_tokens),
                          KVCache.empty(shape.num_layers))
    at_one, stats = _blend(runner, layout, prefix, chunks, BlendConfig(recompute_ratio=1.0, context_drift=True))
    assert stats["context_drift"]
    assert float((at_one - full).abs().max() / full.abs().max()) < 1e-3  # every entry recomputed: the shift is gone
    reused, _ = _blend(runner, layout, prefix, chunks, on, mode="reuse")
    at_zero, stats = _blend(runner, layout, prefix, chunks, BlendConfig(recompute_ratio=0.0, context_drift=True))
    assert not stats["context_drift"] and torch.allclose(at_zero, reused, atol=1e-4)  # nothing recomputed: reuse
    shifted, stats = _blend(runner, layout, prefix, chunks, on)
    plain, plain_stats = _blend(runner, layout, prefix, chunks, BlendConfig(context_drift=False))
    assert stats["context_drift"] and not plain_stats["context_drift"]
    assert not torch.allclose(shifted, plain, atol=1e-3)


def test_a_shifting_reuse_plan_is_reuse_over_whole_chunks_shifted_by_hand(runner, drift):
    """Reuse with shift=True (research's `shift` mode) over whole chunks: nothing recomputed, every stored chunk
    entry shifted first, whatever the setting's own context_drift; shift=False never shifts, even a ratio that
    recomputes."""
    layout, prefix, chunks = _prompt(runner)
    shifted, stats = _blend(runner, layout, prefix, chunks, BlendConfig(context_drift=False), "reuse", True)
    assert stats["context_drift"] and stats["recomputed_tokens"] == 0 and stats["blend_method"] == "shift"
    cache, computed = fuse_chunks(runner, layout, prefix, chunks)
    shift_by_hand(cache, layout, drift, runner.inv_freq)
    assert torch.allclose(shifted, _reuse_over(runner, layout, cache, computed), atol=1e-4)
    reused, reuse_stats = _blend(runner, layout, prefix, chunks, BlendConfig(), "reuse")
    assert not reuse_stats["context_drift"] and reuse_stats["blend_method"] == "reuse"
    assert not torch.allclose(shifted, reused, atol=1e-3)
    _, never = _blend(runner, layout, prefix, chunks, BlendConfig(recompute_ratio=0.3), shift=False)
    assert not never["context_drift"] and never["recomputed_tokens"] > 0


def test_chunks_compressed_at_ingest_are_shifted_and_reused(runner, drift):
    """Over chunks compressed at ingest the default recomputes nothing and adds the drift to their kept entries:
    its logits are plain reuse over a cache shifted by hand. Reuse itself is not shifted, and a request's own
    ratio recomputes there with the compressed-chunk method."""
    from workers.eviction.chunks import compress_chunk
    from workers.requests import CompressionSpec

    layout, prefix, chunks = _prompt(runner)
    small = [compress_chunk(runner, kv, CompressionSpec(policy="kvzip", budget=0.5))[0] for kv in chunks]
    shifted, stats = _blend(runner, layout, prefix, small, BlendConfig())
    assert stats["context_drift"] and stats["recomputed_tokens"] == 0 and stats["recompute_ratio"] == 0.0
    cache, computed = fuse_chunks(runner, layout, prefix, small)
    shift_by_hand(cache, layout, drift, runner.inv_freq)
    assert torch.allclose(shifted, _reuse_over(runner, layout, cache, computed), atol=1e-4)
    plain, plain_stats = _blend(runner, layout, prefix, small, BlendConfig(context_drift=False))
    reused, reuse_stats = _blend(runner, layout, prefix, small, BlendConfig(), "reuse")
    assert not plain_stats["context_drift"] and not reuse_stats["context_drift"]
    assert torch.allclose(plain, reused, atol=1e-4) and not torch.allclose(shifted, plain, atol=1e-3)
    _, asked = _blend(runner, layout, prefix, small, BlendConfig().with_ratio(0.3))
    assert asked["recomputed_tokens"] > 0 and asked["context_drift"]
    assert asked["blend_method"] == COMPRESSED_METHOD


def test_context_drift_is_measured_once_stored_and_reused(runner, monkeypatch, tmp_path):
    monkeypatch.setattr(cd, "DRAWS", 1)
    monkeypatch.setattr(cd, "PROMPT_CHUNKS", 2)
    monkeypatch.setattr(cd, "CHUNK_TOKENS", 32)  # short chunks: the stored measurement's mechanics, not its figures
    monkeypatch.setattr(cd, "drift_path", lambda runner, form: tmp_path / f"drift-{form}.json")
    monkeypatch.setattr(cd, "_DRIFTS", {})
    measured = cd.context_drift(runner, "doc")
    shape = runner.shape
    assert measured.keys.shape == (2, shape.num_layers, shape.num_kv_heads, shape.head_dim)
    assert measured.keys.abs().sum() > 0 and measured.values.abs().sum() > 0
    assert cd.context_drift(runner, "doc") is measured  # this process's copy
    cd._DRIFTS.clear()
    again = cd.context_drift(runner, "doc")  # read back from the file
    assert torch.equal(again.keys, measured.keys) and torch.equal(again.values, measured.values)
    fresh = cd.measure(runner, "doc")  # fixed prompts, seeded draws: the same numbers
    torch.testing.assert_close(fresh.keys, measured.keys)
    record = json.loads((tmp_path / "drift-doc.json").read_text())
    assert (record["fingerprint"], record["form"]) == (runner.fingerprint, "doc")
    (tmp_path / "drift-doc.json").write_text(json.dumps({**record, "fingerprint": "another model"}))
    cd._DRIFTS.clear()
    monkeypatch.setattr(cd, "measure", lambda runner, form: random_drift(shape.num_layers, shape.num_kv_heads,
                                                                         shape.head_dim, 1.0))
    remeasured = cd.context_drift(runner, "doc")  # a file measured on another model is not used
    assert not torch.equal(remeasured.keys, measured.keys)
    assert json.loads((tmp_path / "drift-doc.json").read_text())["fingerprint"] == runner.fingerprint
