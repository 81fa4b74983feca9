"""Every blend selection method through one matrix: ratio 1 = full prefill, ratio 0 = reuse.

The research methods (legolink, attention, hybrids, strided): research/tests/test_selection.py."""

import pytest
import torch

from workers.blend import BlendConfig, fuse_chunks
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.cache import KVCache
from workers.prompt import build_prompt
from workers.selection import SELECTIONS, Gradual, SelectionContext, make_selection

TEXTS = ("The keeper of Marrow Point counted ships each evening in a green ledger.",
         "Copper kettles were hammered by hand, each stamped with the smith's mark.",
         "A slow river bends around the hill; its orchards smell of cider in autumn.")


@pytest.fixture(scope="module")
def prompt(runner):
    chunks = [runner.tokenize(t) for t in TEXTS]
    layout = build_prompt(runner.tokenizer, "", chunks, "What did the keeper count?")
    prefix = runner.chunk_kv(layout.prefix_ids)
    kvs = [runner.chunk_kv(c) for c in chunks]
    ids = torch.tensor(layout.token_ids)
    full = runner.forward(ids, torch.arange(layout.num_tokens), KVCache.empty(runner.shape.num_layers))
    return layout, prefix, kvs, full


def blend(runner, prompt, config, reuse=False):
    """(logits, stats dict) through the prefill pipeline, without the context drift (the method alone)."""
    layout, prefix, kvs, _ = prompt
    out = run_prefill(runner, layout, plan_for("reuse" if reuse else "blend", config), HeldChunks(prefix, kvs))
    return out.logits, out.stats.as_dict()


def relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("method", sorted(SELECTIONS))
def test_full_recompute_equals_full_prefill(runner, prompt, method):
    logits, stats = blend(runner, prompt, BlendConfig(recompute_ratio=1.0, method=method, context_drift=False))
    assert relative(logits, prompt[3]) < 1e-3
    assert logits.argmax() == prompt[3].argmax()
    assert stats["recomputed_tokens"] == sum(e - s for s, e in prompt[0].chunk_spans)


@pytest.mark.parametrize("method", sorted(SELECTIONS))
def test_zero_recompute_equals_reuse(runner, prompt, method):
    logits, stats = blend(runner, prompt, BlendConfig(recompute_ratio=0.0, method=method, context_drift=False))
    reused, _ = blend(runner, prompt, BlendConfig(), reuse=True)
    assert relative(logits, reused) < 1e-3
    assert stats["recomputed_tokens"] == 0 and stats["blend_method"] == method


@pytest.mark.parametrize("method", sorted(SELECTIONS))
def test_partial_recompute_spends_the_budget(runner, prompt, method):
    layout = prompt[0]
    logits, stats = blend(runner, prompt, BlendConfig(recompute_ratio=0.3, method=method))
    chunk_tokens = sum(e - s for s, e in layout.chunk_spans)
    assert abs(stats["recomputed_tokens"] - 0.3 * chunk_tokens) <= len(layout.chunk_spans)
    assert 0 < stats["compute_fraction"] < 1 and torch.isfinite(logits).all()


def _context(runner, prompt, ratio):
    layout, prefix, kvs, _ = prompt
    cache, computed = fuse_chunks(runner, layout, prefix, kvs)
    chunk = (~computed).nonzero().flatten()
    chunk = chunk[chunk >= layout.prefix_len]
    return SelectionContext(runner, layout, cache, chunk, computed.nonzero().flatten(),
                            int(round(ratio * chunk.numel())))


def test_gradual_narrows_from_a_wider_set_to_the_budget(runner, prompt):
    ctx = _context(runner, prompt, 0.2)
    method = Gradual(check_layer=1, gradual_widen=3.0, gradual_steps=3)
    counts = [method.count_at(layer, ctx) for layer in range(6)]
    assert counts[0] is None and counts[4] is None
    assert counts[1] == min(ctx.candidates.numel(), round(3 * ctx.budget)) and counts[3] == ctx.budget
    assert counts[1] > counts[2] > counts[3]


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="unknown blend method .nope."):
        BlendConfig().named("nope")  # when the setting is made
    with pytest.raises(ValueError, match="unknown blend method"):
        make_selection(BlendConfig(method="nope"))
