"""Research's selection methods (research/ragkv_research/selection.py), at the selection interface:
`start` / `keep` over a real fused cache of the default model."""

import pytest
import torch

from ragkv_research.selection import (LegoLink, Strided, WithAttended, WithSinks, question_attention)
from workers.blend import fuse_chunks
from workers.prompt import build_prompt
from workers.selection import SELECTIONS, Deviation, SelectionContext, select_tokens

TEXTS = ("The keeper of Marrow Point counted ships each evening in a green ledger.",
         "Copper kettles were hammered by hand, each stamped with the smith's mark.",
         "A slow river bends around the hill; its orchards smell of cider in autumn.")
NAMES = ("legolink", "legolink-deviation", "legolink-gradual", "legolink-attention", "legolink-chunks",
         "legolink-strided", "attended-deviation", "attended-gradual", "attention", "chunks", "strided")


@pytest.fixture(scope="module")
def prompt(runner):
    chunks = [runner.tokenize(t) for t in TEXTS]
    layout = build_prompt(runner.tokenizer, "", chunks, "What did the keeper count?")
    return layout, runner.chunk_kv(layout.prefix_ids), [runner.chunk_kv(c) for c in chunks]


def _context(runner, prompt, ratio):
    layout, prefix, kvs = prompt
    cache, computed = fuse_chunks(runner, layout, prefix, kvs)
    chunk = (~computed).nonzero().flatten()
    chunk = chunk[chunk >= layout.prefix_len]
    return SelectionContext(runner, layout, cache, chunk, computed.nonzero().flatten(),
                            int(round(ratio * chunk.numel())))


def test_every_research_method_registers_into_the_product_registry():
    assert set(NAMES) <= set(SELECTIONS)


@pytest.mark.parametrize("k", [1, 3])
def test_legolink_picks_exactly_the_first_k_tokens_of_every_chunk(runner, prompt, k):
    layout = prompt[0]
    ctx = _context(runner, prompt, 0.15)
    active = LegoLink(sink_tokens=k).start(ctx)
    heads = {i for start, _ in layout.chunk_spans for i in range(start, start + k)}
    assert set(active.tolist()) == heads | set(ctx.always.tolist())


def test_legolink_without_k_takes_each_chunks_ratio_share(runner, prompt):
    ctx = _context(runner, prompt, 0.5)
    picked = set(LegoLink().start(ctx).tolist())
    for start, end in prompt[0].chunk_spans:
        k = round(0.5 * (end - start))
        assert set(range(start, end)) & picked == set(range(start, start + k))


@pytest.mark.parametrize("method", ["legolink-deviation", "attended-deviation"])
def test_hybrid_keeps_its_forced_tokens_and_fills_the_budget_by_deviation(runner, prompt, method):
    """legolink-: the first 2 tokens of every chunk; attended-: the question probe's top half of the budget."""
    layout = prompt[0]
    ctx = _context(runner, prompt, 0.4)
    inner = Deviation(check_layer=1)
    selection = WithSinks(inner, sink_tokens=2) if method == "legolink-deviation" else WithAttended(inner, 0.5)
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
    picked = Strided().start(ctx)
    picked = picked[torch.isin(picked, ctx.candidates)]
    assert picked.numel() == ctx.budget
    gaps = torch.diff(torch.searchsorted(ctx.candidates, picked))
    assert int(gaps.min()) >= 3 and int(gaps.max()) <= 5  # every 4th candidate, give or take rounding


def test_attended_share_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="attended_share must be in"):
        WithAttended(Deviation(), attended_share=1.5)
