"""Every blend selection method through one matrix: ratio 1 = full prefill, ratio 0 = reuse."""

import pytest
import torch

from workers.blend import BlendConfig, blend_prefill, fuse_chunks
from workers.cache import KVCache
from workers.chunk_forms import compute_chunk
from workers.prompt import build_prompt
from workers.selection import SELECTIONS, Gradual, SelectionContext, make_selection, question_attention, select_tokens

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
    layout, prefix, kvs, _ = prompt
    cache, computed = fuse_chunks(runner, layout, prefix, kvs)
    return blend_prefill(runner, layout, cache, computed, config, reuse=reuse)


def relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("drift", [False, True])
@pytest.mark.parametrize("method", sorted(SELECTIONS))
def test_full_recompute_equals_full_prefill(runner, prompt, method, drift):
    logits, stats = blend(runner, prompt, BlendConfig(recompute_ratio=1.0, method=method, drift=drift))
    assert relative(logits, prompt[3]) < 1e-3
    assert logits.argmax() == prompt[3].argmax()
    assert stats["recomputed_tokens"] == sum(e - s for s, e in prompt[0].chunk_spans)


@pytest.mark.parametrize("drift", [False, True])
@pytest.mark.parametrize("method", sorted(SELECTIONS))
def test_zero_recompute_equals_reuse(runner, prompt, method, drift):
    logits, stats = blend(runner, prompt, BlendConfig(recompute_ratio=0.0, method=method, drift=drift))
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


@pytest.mark.parametrize("k", [1, 3])
def test_legolink_picks_exactly_the_first_k_tokens_of_every_chunk(runner, prompt, k):
    layout = prompt[0]
    ctx = _context(runner, prompt, 0.15)
    active = make_selection(BlendConfig(method="legolink", sink_tokens=k)).start(ctx)
    heads = {i for start, _ in layout.chunk_spans for i in range(start, start + k)}
    assert set(active.tolist()) == heads | set(ctx.always.tolist())
    _, stats = blend(runner, prompt, BlendConfig(method="legolink", sink_tokens=k))
    assert stats["recomputed_tokens"] == k * len(layout.chunk_spans)


def test_legolink_without_k_takes_each_chunks_ratio_share(runner, prompt):
    layout = prompt[0]
    ctx = _context(runner, prompt, 0.5)
    picked = set(make_selection(BlendConfig(recompute_ratio=0.5, method="legolink")).start(ctx).tolist())
    for start, end in layout.chunk_spans:
        k = round(0.5 * (end - start))
        assert set(range(start, end)) & picked == set(range(start, start + k))


@pytest.mark.parametrize("method", ["legolink-deviation", "attended-deviation"])
def test_hybrid_keeps_its_forced_tokens_and_fills_the_budget_by_deviation(runner, prompt, method):
    """legolink-: the first 2 tokens of every chunk; attended-: the question probe's top half of the budget."""
    layout = prompt[0]
    ctx = _context(runner, prompt, 0.4)
    selection = make_selection(BlendConfig(recompute_ratio=0.4, method=method, sink_tokens=2, attended_share=0.5,
                                           check_layer=1))
    active = selection.start(ctx)
    hidden = runner.layer_forward(0, runner.embed(torch.tensor(layout.token_ids)[active]), active, ctx.cache,
                                  slots=active)
    kept = set(selection.keep(1, ctx, hidden, active).tolist())
    if method == "legolink-deviation":
        forced = {i for start, _ in layout.chunk_spans for i in range(start, start + 2)}
    else:
        probe = question_attention(_context(runner, prompt, 0.4), None)  # the same probe over a fresh fused cache
        forced = set(select_tokens(probe, ctx.candidates, round(0.5 * ctx.budget)).tolist())
        assert ctx.memo["attended"].tolist() == sorted(forced)
    assert forced <= kept and set(ctx.always.tolist()) <= kept
    assert len(kept & set(ctx.candidates.tolist())) == ctx.budget


def test_strided_takes_an_even_sample_of_the_chunk_tokens(runner, prompt):
    ctx = _context(runner, prompt, 0.25)
    picked = make_selection(BlendConfig(recompute_ratio=0.25, method="strided")).start(ctx)
    picked = picked[torch.isin(picked, ctx.candidates)]
    assert picked.numel() == ctx.budget
    gaps = torch.diff(torch.searchsorted(ctx.candidates, picked))
    assert int(gaps.min()) >= 3 and int(gaps.max()) <= 5  # every 4th candidate, give or take rounding


def test_drift_repair_brings_blend_closer_to_the_full_prefill(runner, prompt):
    """Chunks in the engine's `lead` form, LegoLink at 30%: shifting the stored K/V by the recomputed
    tokens' drift lowers the last token's KL to the full prefill's distribution."""
    layout, prefix, _, full = prompt
    kvs = [compute_chunk(runner, layout.token_ids[start:end], "lead") for start, end in layout.chunk_spans]
    kl = {}
    for drift in (False, True):
        cache, computed = fuse_chunks(runner, layout, prefix, kvs)
        logits, stats = blend_prefill(runner, layout, cache, computed,
                                      BlendConfig(recompute_ratio=0.3, method="legolink", drift=drift))
        assert stats["key_drift"] is drift
        kl[drift] = float(torch.nn.functional.kl_div(logits.log_softmax(-1), full.log_softmax(-1), log_target=True,
                                                     reduction="sum"))
    assert kl[True] < 0.5 * kl[False]


def test_gradual_narrows_from_a_wider_set_to_the_budget(runner, prompt):
    ctx = _context(runner, prompt, 0.2)
    method = Gradual(check_layer=1, gradual_widen=3.0, gradual_steps=3)
    counts = [method.count_at(layer, ctx) for layer in range(6)]
    assert counts[0] is None and counts[4] is None
    assert counts[1] == min(ctx.candidates.numel(), round(3 * ctx.budget)) and counts[3] == ctx.budget
    assert counts[1] > counts[2] > counts[3]


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="unknown blend method .nope."):
        BlendConfig(compressed_method="nope")  # either name, when the setting is made
    with pytest.raises(ValueError, match="unknown blend method"):
        make_selection(BlendConfig(method="nope"))


def test_attended_share_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="attended_share must be in"):
        make_selection(BlendConfig(method="attended-gradual", attended_share=1.5))
