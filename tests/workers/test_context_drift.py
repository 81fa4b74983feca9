"""Context drift (workers/context_drift.py): the shift's math, its place in blend, and the stored measurement."""

from __future__ import annotations

import json

from dataclasses import replace

import pytest
import torch

from workers import context_drift as cd
from workers.blend import COMPRESSED_METHOD, BlendConfig, fuse_chunks, recompute
from workers.cache import KVCache, LayerKV
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.prompt import build_prompt
from workers.rope import rerotate_keys
from workers.selfcheck import CHECK_TEXTS


def random_drift(layers: int, heads: int, dim: int, scale: float, seed: int = 0) -> cd.ContextDrift:
    g = torch.Generator().manual_seed(seed)
    return cd.ContextDrift(keys=torch.randn(2, layers, heads, dim, generator=g) * scale,
                           values=torch.randn(2, layers, heads, dim, generator=g) * scale)


def test_shift_chunks_adds_the_pre_rope_drift_of_each_tokens_slot():
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    g = torch.Generator().manual_seed(1)
    keys, values = torch.randn(2, 3, 7, 8, generator=g), torch.randn(2, 3, 7, 8, generator=g)  # [L, H, T, D]
    positions = torch.arange(7) + 40
    cache = KVCache([LayerKV(keys[i].clone(), values[i].clone(), positions) for i in range(2)])
    drift = random_drift(2, 3, 8, 1.0)
    cd.shift_chunks(cache, (1, 3, 6), drift, inv_freq)  # tokens 1-2 in the first chunk, 3-5 in later ones
    for layer, kv in enumerate(cache.layers):
        for token, slot in ((1, 0), (2, 0), (3, 1), (4, 1), (5, 1)):
            pre = rerotate_keys(keys[layer][:, token:token + 1], -int(positions[token]), inv_freq)
            expected = rerotate_keys(pre + drift.keys[slot, layer][:, None], int(positions[token]), inv_freq)
            torch.testing.assert_close(kv.keys[:, token:token + 1], expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(kv.values[:, token], values[layer][:, token] + drift.values[slot, layer])
        untouched = torch.tensor([0, 6])
        assert torch.equal(kv.keys[:, untouched], keys[layer][:, untouched])
        assert torch.equal(kv.values[:, untouched], values[layer][:, untouched])


def test_chunk_range_spans_every_chunk_and_marks_the_first():
    layout = build_prompt(_Tok(), "", [[5] * 3, [6] * 2, [7] * 4], "q")
    start, first_end, end = cd.chunk_range(layout)
    assert (start, first_end, end) == (layout.chunk_spans[0][0], layout.chunk_spans[0][1], layout.chunk_spans[-1][1])
    assert first_end - start == 3 and end - start == 3 + 2 + 4 + 2  # two separators inside


class _Tok:
    """A tokenizer stub for layout arithmetic only: every text is one token, the template is empty."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1] if text else []}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return messages[-1]["content"]


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
    cd.shift_chunks(cache, cd.chunk_range(layout), drift, runner.inv_freq)
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
    cd.shift_chunks(cache, cd.chunk_range(layout), drift, runner.inv_freq)
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
