"""Every policy x budget on the real default model: protection, real removal, the masked reference,
the L1 bound on real activations, decode semantics (prefill presses append, decode-time methods stay
at budget), and streaming far beyond its budget."""

from __future__ import annotations

import pytest
import torch

from ragkv.errors import InvalidArgument
from workers.attention import attend, attention_weights
from workers.cache import KVCache, LayerKV
from workers.eviction import POLICIES, make_compressor
from workers.eviction.scores import eviction_l1
from workers.generate import DecodeHooks, SamplingParams, decode
from workers.prompt import build_prompt
from workers.requests import CompressionSpec

POLICY_NAMES = sorted(POLICIES)
BUDGETS = (0.15, 0.3, 0.6)
PROTECT = (True, False)
SPAN = (100, 106)  # an extra protected span inside the document
SYSTEM = "You are a careful assistant. Answer questions about the document in one sentence."
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
WINDOW_QUERIES = 8


def clone(cache: KVCache) -> KVCache:
    return KVCache([LayerKV(kv.keys.clone(), kv.values.clone(), kv.positions.clone(),
                            None if kv.head_mask is None else kv.head_mask.clone()) for kv in cache.layers])


def spec_for(policy: str, budget: float, protect: bool) -> CompressionSpec:
    return CompressionSpec(policy=policy, budget=budget, protect_system_prompt=protect, protected_spans=(SPAN,))


@pytest.fixture(scope="module")
def prefilled(runner):
    """One prefill (~230 tokens) observed by a compressor for every (policy, budget, protect) at once."""
    text = FILLER * 4 + "The pass key is 71942. Remember it. " + FILLER * 4
    layout = build_prompt(runner.tokenizer, SYSTEM, [runner.tokenize(text)], "What is the pass key?")
    n = layout.num_tokens
    assert n <= 300 and SPAN[1] < n
    compressors = {(p, b, pr): make_compressor(spec_for(p, b, pr), runner.shape, layout.prefix_len, n,
                                               question_start=layout.suffix_start)
                   for p in POLICY_NAMES for b in BUDGETS for pr in PROTECT}
    queries: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def observer(layer, q, q_positions, kv):
        queries[layer] = (q[:, -WINDOW_QUERIES:].clone(), q_positions[-WINDOW_QUERIES:].clone())
        for c in compressors.values():
            c.observer(layer, q, q_positions, kv)

    cache = KVCache.empty(runner.shape.num_layers)
    ids = torch.tensor(layout.token_ids)
    logits = runner.forward(ids, torch.arange(n), cache, observer=observer)
    for c in compressors.values():
        c.prepare(runner, cache, layout.token_ids, (0, layout.suffix_start))
    return {"layout": layout, "cache": cache, "logits": logits, "compressors": compressors, "queries": queries}


def protected_positions(layout, protect: bool) -> set[int]:
    keep = set(range(4)) | set(range(*SPAN))
    return keep | set(range(layout.prefix_len)) if protect else keep


def kept_positions(kv: LayerKV, head: int) -> set[int]:
    positions = kv.positions if kv.positions.dim() == 1 else kv.positions[head]
    if kv.head_mask is not None:
        positions = positions[kv.head_mask[head]]
    return set(positions.tolist())


@pytest.mark.parametrize("protect", PROTECT, ids=["protect", "noprotect"])
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_policy_matrix(runner, prefilled, policy, budget, protect):
    layout, full = prefilled["layout"], prefilled["cache"]
    compressor = prefilled["compressors"][(policy, budget, protect)]
    cache = clone(full)
    keeps = compressor.plan(cache)
    stats = compressor.compress(cache, keeps)
    n = layout.num_tokens
    budget_tokens = CompressionSpec(budget=budget).budget_tokens(n)
    protected = protected_positions(layout, protect)
    heads = runner.shape.num_kv_heads
    per_head = compressor.policy.per_head

    # memory really drops; the budget counts protected tokens
    assert stats["kv_bytes_after"] < stats["kv_bytes_before"] == full.nbytes()
    assert stats["kv_bytes_after"] == cache.nbytes()
    for i, kv in enumerate(cache.layers):
        assert kv.head_length <= min(n, compressor.layer_budgets[i] if not per_head else n)
        for h in range(heads):
            assert protected <= kept_positions(kv, h), f"layer {i} head {h} lost protected tokens"
        if per_head:
            assert int(keeps[i].sum()) == compressor.layer_budgets[i] * heads
        else:
            assert kv.num_tokens == compressor.layer_budgets[i]
    assert sum(compressor.layer_budgets) == budget_tokens * runner.shape.num_layers
    if policy in ("adakv", "kvzip"):  # heads keep unequal numbers of tokens: packed, memory = the entries kept
        assert any(kv.head_mask is not None and len(set(kv.head_mask.sum(1).tolist())) > 1 for kv in cache.layers)
        assert all(kv.packed or kv.head_mask is None or bool(kv.head_mask.all()) for kv in cache.layers)
        assert stats["packed"] and any(kv.packed for kv in cache.layers)
        for kv, keep in zip(cache.layers, keeps):
            assert kv.keys.shape[0] * kv.keys.shape[1] == int(keep.sum())  # no padding: exactly the kept entries
            assert stats["kv_bytes_after"] <= 1.05 * budget_tokens / n * stats["kv_bytes_before"]
    if policy == "snapkv":  # per-head selection, equal counts: heads keep different tokens, no padding
        assert any(not torch.equal(k[0], k[1]) for k in keeps)
        assert all(kv.head_mask is None or bool(kv.head_mask.all()) for kv in cache.layers)
    if policy in ("pyramidkv", "dynamickv", "kvzip"):  # layers keep unequal numbers of tokens
        assert len({int(keep.sum()) for keep in keeps}) > 1
    if policy == "pyramidkv":
        assert compressor.layer_budgets == sorted(compressor.layer_budgets, reverse=True)
    assert sum(kv.head_length for kv in cache.layers) < n * runner.shape.num_layers

    # masked reference + L1 bound on real activations, every layer and head
    scale = runner.layers[0].self_attn.scaling
    for i, (kv_full, kv, keep) in enumerate(zip(full.layers, cache.layers, keeps)):
        q, q_pos = prefilled["queries"][i]
        ref = attend(q, kv_full.keys, kv_full.values, q_pos, kv_full.positions, scale, head_mask=keep)
        out = attend(q, kv.keys, kv.values, q_pos, kv.positions, scale, kv.head_mask)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
        attn = attention_weights(q, kv_full.keys, q_pos, kv_full.positions, scale)
        loss, bound = eviction_l1(attn, kv_full.values, keep)
        assert (loss <= bound * (1 + 1e-4) + 1e-5).all(), f"layer {i}: L1 bound violated"
    assert 0.0 < stats["l1_loss"] <= stats["l1_bound"]

    # the next token through the compressed cache = through the full cache with an explicit mask
    next_id = torch.tensor([int(prefilled["logits"].argmax())])
    masked = KVCache([LayerKV(kv.keys.clone(), kv.values.clone(), kv.positions.clone(), keep.clone())
                      for kv, keep in zip(full.layers, keeps)])
    probe = clone(cache)
    want = runner.forward(next_id, torch.tensor([n]), masked)
    got = runner.forward(next_id, torch.tensor([n]), probe)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)

    # decoding: decode-time methods stay at budget, prefill presses append; protected tokens stay
    hooks = compressor.decode_hooks()
    sizes = []
    after = hooks.after_step

    def record(c):
        if after is not None:  # prefill presses append: no decode hook
            after(c)
        sizes.append([kv.head_length for kv in c.layers])

    after_prefill = [kv.head_length for kv in cache.layers]
    tokens = list(decode(NoStop(runner), cache, prefilled["logits"], n, SamplingParams(max_new_tokens=3),
                         DecodeHooks(observer=hooks.observer, after_step=record)))
    assert len(tokens) == 3 and len(sizes) == 2
    assert compressor.policy.phase == ("decode" if policy in ("streaming", "h2o", "tova") else "prefill")
    for i, kv in enumerate(cache.layers):
        for h in range(heads):
            assert protected <= kept_positions(kv, h)
        if compressor.policy.phase == "prefill":  # the prompt is compressed once; generated tokens are appended
            assert [s[i] for s in sizes] == [after_prefill[i] + 1, after_prefill[i] + 2]
            assert {n, n + 1} <= kept_positions(kv, 0)
        elif not per_head:
            assert all(s[i] == compressor.layer_budgets[i] for s in sizes)
        else:
            assert int(kv.head_mask.sum()) <= budget_tokens * heads


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_budget_below_protected_is_invalid(runner, policy):
    with pytest.raises(InvalidArgument) as err:
        make_compressor(CompressionSpec(policy=policy, budget=10), runner.shape, prefix_len=30, prompt_len=200)
    assert err.value.field == "compression.budget"
    with pytest.raises(InvalidArgument):
        make_compressor(CompressionSpec(policy=policy, budget=0.05, protect_system_prompt=False,
                                        protected_spans=((50, 70),)), runner.shape, prefix_len=0, prompt_len=200)
    make_compressor(CompressionSpec(policy=policy, budget=10, protect_system_prompt=False), runner.shape,
                    prefix_len=30, prompt_len=200)  # only the 4 sinks are protected: fine


class NoStop:
    """The runner, minus stop tokens: the stream must run for its full length."""

    stop_token_ids: set[int] = set()

    def __init__(self, runner):
        self.device, self.forward = runner.device, runner.forward


def distinct_2(tokens: list[int]) -> float:
    pairs = list(zip(tokens, tokens[1:]))
    return len(set(pairs)) / max(1, len(pairs))


def test_streaming_generates_4x_budget_with_constant_memory(runner):
    system = "You are a storyteller."
    layout = build_prompt(runner.tokenizer, system, [runner.tokenize(
        "A fox lived at the edge of a large forest near a small village.")],
        "Tell me a long story about the fox, its friends and their adventures in the forest.")
    n, budget = layout.num_tokens, 32
    assert layout.prefix_len < budget < n
    compressor = make_compressor(CompressionSpec(policy="streaming", budget=budget), runner.shape,
                                 layout.prefix_len, n, inv_freq=runner.inv_freq)
    cache = KVCache.empty(runner.shape.num_layers)
    logits = runner.forward(torch.tensor(layout.token_ids), torch.arange(n), cache, observer=compressor.observer)
    compressor.compress(cache)
    bytes_after_prefill = cache.nbytes()
    prefix_values = [kv.values[:, :layout.prefix_len].clone() for kv in cache.layers]
    hooks = compressor.decode_hooks()
    trace = []

    def record(c):
        hooks.after_step(c)
        trace.append((c.nbytes(), {kv.num_tokens for kv in c.layers},
                      max(int(kv.positions.max() - kv.positions.min()) for kv in c.layers)))

    steps = 4 * budget
    tokens = list(decode(NoStop(runner), cache, logits, n, SamplingParams(max_new_tokens=steps),
                         DecodeHooks(observer=hooks.observer, after_step=record)))
    assert len(tokens) == steps, runner.detokenize(tokens)
    assert {t[0] for t in trace} == {bytes_after_prefill}
    assert {frozenset(t[1]) for t in trace} == {frozenset({budget})}
    assert max(t[2] for t in trace) < 2 * budget  # window kept on compact positions (distances bounded)
    assert all(torch.isfinite(kv.keys).all() and torch.isfinite(kv.values).all() for kv in cache.layers)
    assert distinct_2(tokens) > 0.5, runner.detokenize(tokens)
    # re-rotation moved positions, but the protected prefix (sinks + system prompt) is still the first slots
    for kv, values in zip(cache.layers, prefix_values):
        assert torch.equal(kv.values[:, :layout.prefix_len], values)
