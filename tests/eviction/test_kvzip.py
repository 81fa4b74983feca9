"""KVzip on the real default model: query-agnostic scores, global non-uniform budgets, per-head caps,
and the decode semantics a request's decode budget asks for."""

from __future__ import annotations

import pytest
import torch

from workers.cache import KVCache, LayerKV
from workers.eviction import POLICIES, make_compressor
from workers.eviction.budgets import global_layer_counts, select_per_head
from workers.eviction import scores
from workers.eviction.kvzip import KVzipSnap, reconstruction_scores
from workers.eviction.policies import ScoreContext
from workers.generate import DecodeHooks, SamplingParams, decode
from workers.prompt import build_prompt
from workers.requests import CompressionSpec

SYSTEM = "You are a careful assistant."
CHUNKS = ("The grass is green. The sky is blue. The pass key is 71942. Remember it. The sun is yellow.",
          "Paris is the capital of France. Bananas are yellow. Mount Everest is 8849 metres tall.")
QUESTIONS = ("What is the pass key?", "Which city is the capital of France, and how tall is Mount Everest in metres?")



class NoStop:
    stop_token_ids: set[int] = set()

    def __init__(self, runner):
        self.device, self.forward = runner.device, runner.forward


def prefill(runner, question: str, spec: CompressionSpec):
    layout = build_prompt(runner.tokenizer, SYSTEM, [runner.tokenize(c) for c in CHUNKS], question)
    n = layout.num_tokens
    compressor = make_compressor(spec, runner.shape, layout.prefix_len, n, question_start=layout.suffix_start,
                                 inv_freq=runner.inv_freq)
    cache = KVCache.empty(runner.shape.num_layers)
    logits = runner.forward(torch.tensor(layout.token_ids), torch.arange(n), cache, observer=compressor.observer)
    return layout, cache, logits, compressor


def test_kvzip_is_registered_query_agnostic():
    agnostic = {name for name, cls in POLICIES.items() if cls().query_agnostic}
    assert agnostic == {"kvzip", "capkv"}
    assert CompressionSpec(policy="kvzip", budget=0.3).policy == "kvzip"  # validation reads the registry


def test_kvzip_scores_and_kept_set_do_not_depend_on_the_question(runner):
    """Same chunks, two different questions: identical scores over the context, identical kept set
    (int budgets that leave the context the same number of slots once the question is kept)."""
    kept, scores = [], []
    for question in QUESTIONS:
        layout = build_prompt(runner.tokenizer, SYSTEM, [runner.tokenize(c) for c in CHUNKS], question)
        question_tokens = layout.num_tokens - layout.suffix_start
        spec = CompressionSpec(policy="kvzip", budget=layout.prefix_len + 12 + question_tokens)
        layout, cache, _, compressor = prefill(runner, question, spec)
        context = layout.suffix_start
        compressor.prepare(runner, cache, layout.token_ids, (0, context))
        raw = reconstruction_scores(runner, cache, layout.token_ids, (0, context))
        keeps = compressor.plan(cache)
        assert all(bool(k[:, context:].all()) for k in keeps)  # the question is kept
        kept.append([k[:, :context] for k in keeps])
        scores.append([s[:, :context] for s in raw])
        assert all(bool(torch.isinf(s[:, context:]).all()) for s in raw)
    for a, b in zip(*scores):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert all(torch.equal(a, b) for a, b in zip(*kept))


def test_global_layer_counts_and_head_cap():
    torch.manual_seed(0)
    scores = [torch.rand(3, 40) * (i + 1) for i in range(4)]  # later layers score higher
    protected = [torch.zeros(3, 40, dtype=torch.bool) for _ in range(4)]
    for p in protected:
        p[:, :2] = True
    valid = [torch.ones(3, 40, dtype=torch.bool) for _ in range(4)]
    counts = global_layer_counts(scores, protected, valid, budget=10)
    assert abs(sum(counts) - 40) < 1e-6 and counts == sorted(counts)  # budget * layers; more to higher scores
    skewed = torch.rand(3, 40)
    skewed[0] += 10  # head 0 would take everything
    free = select_per_head(skewed, protected[0], valid[0], budget=10, floor=0.0)
    capped = select_per_head(skewed, protected[0], valid[0], budget=10, floor=0.0, cap=1.0)
    assert int(free.sum()) == int(capped.sum()) == 30
    assert int(free.sum(1).max()) > 10 and capped.sum(1).tolist() == [10, 10, 10]
    assert capped[:, :2].all()


@pytest.mark.parametrize("policy,decode_budget", [("snapkv", None), ("kvzip", None), ("snapkv", 30),
                                                  ("h2o", None), ("h2o", 40), ("tova", 30)])
def test_decode_semantics(runner, policy, decode_budget):
    """Prefill presses append generated tokens unless a decode budget is asked; decode-time methods keep
    their budget (or the decode budget) at every step."""
    spec = CompressionSpec(policy=policy, budget=28, decode_budget=decode_budget)
    layout, cache, logits, compressor = prefill(runner, QUESTIONS[0], spec)
    compressor.prepare(runner, cache, layout.token_ids, (0, layout.suffix_start))
    compressor.compress(cache)
    valid = lambda c: [int(kv.head_mask.sum()) // kv.head_mask.shape[0] if kv.head_mask is not None  # noqa: E731
                       else kv.num_tokens for kv in c.layers]
    after_prefill = valid(cache)
    sizes = []
    hooks = compressor.decode_hooks()

    def record(c):
        if hooks.after_step is not None:
            hooks.after_step(c)
        sizes.append(valid(c))

    steps = 16
    tokens = list(decode(NoStop(runner), cache, logits, layout.num_tokens, SamplingParams(max_new_tokens=steps),
                         DecodeHooks(observer=hooks.observer, after_step=record)))
    assert len(tokens) == steps
    bound = decode_budget if decode_budget is not None else (28 if policy in ("h2o", "tova") else None)
    if bound is None:  # appended: one more slot per step in every layer
        assert sizes[-1] == [s + steps - 1 for s in after_prefill]
        assert compressor.stats()["decode_evictions"] == 0
    else:  # per layer at most its share of the decode budget; the mean is the budget
        assert max(sizes[-1]) <= max(bound, max(after_prefill)) + 1
        assert abs(sum(sizes[-1]) / len(sizes[-1]) - bound) <= 1
        assert compressor.stats()["decode_budget_tokens"] == bound


def test_kvzip_snap_is_kvzip_plus_the_question_picks(runner):
    """share 0 keeps exactly kvzip's set; share > 0 changes it at the same per-layer bytes. The policy reads
    the question, so it is not query-agnostic (no ingest-time compression)."""
    assert not POLICIES["kvzip-snap"]().query_agnostic

    def keeps(policy):
        layout, cache, _, compressor = prefill(runner, QUESTIONS[0], CompressionSpec(policy="kvzip-snap", budget=40))
        compressor.policy = policy
        compressor.prepare(runner, cache, layout.token_ids, (0, layout.suffix_start))
        return compressor.plan(cache)

    plain, none, mixed = keeps(POLICIES["kvzip"]()), keeps(KVzipSnap(share=0.0)), keeps(KVzipSnap(share=0.5))
    assert all(torch.equal(a, b) for a, b in zip(plain, none))
    assert [int(k.sum()) for k in mixed] == [int(k.sum()) for k in plain]  # same layer budgets, same bytes
    assert any(not torch.equal(a, b) for a, b in zip(plain, mixed))


def test_kvzip_snap_score_forces_each_heads_top_question_picks():
    """The math on a synthetic layer: kvzip's scores, with each head's top share x free slots by SnapKV's
    pooled window attention (protected slots excluded) raised to +inf; nothing else changes."""
    torch.manual_seed(0)
    heads, t, d = 2, 30, 8
    kv = LayerKV(torch.randn(heads, t, d), torch.randn(heads, t, d), torch.arange(t))
    protected = torch.zeros(heads, t, dtype=torch.bool)
    protected[:, :4] = True
    prepared = torch.rand(heads, t)
    ctx = ScoreContext(layer=0, kv=kv, valid=torch.ones(heads, t, dtype=torch.bool), queries=torch.randn(heads, 3, d),
                       q_positions=torch.arange(27, 30), accumulated=None, scale=d ** -0.5, free=10,
                       protected=protected, prepared=prepared)
    policy = KVzipSnap(share=0.5, kernel=1)
    out = policy.score(ctx)
    question = scores.pooled_window_attention(ctx.window_attention(), heads, 1).masked_fill(protected, float("-inf"))
    picks = torch.topk(question, 5, dim=1).indices
    assert bool(torch.isinf(out.gather(1, picks)).all())
    rest = torch.ones_like(protected).scatter(1, picks, False)
    torch.testing.assert_close(out[rest], prepared[rest])
    assert not bool(torch.isinf(out[:, :4]).any())  # protection is the Compressor's, not a pick
