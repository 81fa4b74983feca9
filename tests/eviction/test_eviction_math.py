"""The eviction math as plain functions: selection, allocation, leverage, L1 bound, compaction."""

from __future__ import annotations

import torch

from workers.attention import attend, attention_weights
from workers.cache import LayerKV
from workers.eviction import scores
from workers.eviction.budgets import allocate, protected_mask, pyramid_weights, select_kept_tokens, select_per_head
from workers.eviction.slots import compact_positions, keep_slots
from workers.rope import apply_rope, rope_cos_sin


def test_select_tokens_keeps_protected_and_budget():
    scores_ = torch.tensor([9.0, 0.1, 5.0, 0.2, 7.0, 0.3])
    protected = torch.tensor([False, True, False, False, False, False])
    keep = select_kept_tokens(scores_, protected, budget=3)
    assert keep.tolist() == [True, True, False, False, True, False]


def test_select_per_head_unequal_lengths_and_total():
    torch.manual_seed(0)
    s = torch.rand(3, 20)
    s[0] *= 10  # head 0 has the big scores: it should win most of the shared budget
    protected = torch.zeros(3, 20, dtype=torch.bool)
    protected[:, :2] = True
    valid = torch.ones(3, 20, dtype=torch.bool)
    keep = select_per_head(s, protected, valid, budget=6, floor=0.25)
    assert int(keep.sum()) == 18
    assert keep[:, :2].all()
    counts = keep.sum(dim=1)
    assert counts[0] > counts[1] and counts[0] > counts[2]
    assert (counts >= 2 + 1).all()  # protected + the floor share


def test_allocate_sums_and_clamps():
    budgets = allocate(pyramid_weights(10), 50, lower=[20] * 10, upper=[100] * 10)
    assert sum(budgets) == 500
    assert budgets == sorted(budgets, reverse=True)
    assert all(20 <= b <= 100 for b in budgets)
    budgets = allocate([1, 1, 100], 30, lower=[5, 5, 5], upper=[40, 40, 40])
    assert sum(budgets) == 90 and budgets[2] == 40


def test_protected_mask():
    positions = torch.arange(12)
    mask = protected_mask(positions, sink_tokens=2, prefix_len=0, spans=((5, 7),))
    assert mask.nonzero().flatten().tolist() == [0, 1, 5, 6]
    assert protected_mask(positions, 4, 6).sum() == 6


def test_key_leverage_range_and_subspace():
    torch.manual_seed(0)
    basis = torch.linalg.qr(torch.randn(16, 16)).Q
    inside = torch.randn(1, 10, 2) @ basis[:, :2].T  # keys in a 2-d subspace
    outside = torch.randn(1, 3, 1) @ basis[:, 5:6].T * 0.1
    keys = torch.cat([inside, outside], dim=1)  # [1, 13, 16]
    lev = scores.key_leverage(keys, rank=2)
    assert lev.shape == (1, 13)
    assert ((lev >= -1e-6) & (lev <= 1 + 1e-6)).all()
    assert torch.allclose(lev[0, :10], torch.ones(10), atol=1e-4)
    assert (lev[0, 10:] < 1e-3).all()


def test_pooled_window_attention_shape_and_gqa():
    attn = torch.softmax(torch.randn(6, 4, 30), dim=-1)
    out = scores.pooled_window_attention(attn, num_kv_heads=2, kernel=5, pool="avg")
    assert out.shape == (2, 30)
    ref = attn.sum(1).reshape(2, 3, 30).mean(1)
    assert torch.allclose(scores.pooled_window_attention(attn, 2, kernel=1), ref)


def test_l1_bound_random():
    torch.manual_seed(1)
    for _ in range(20):
        attn = torch.softmax(torch.randn(6, 5, 40) * 3, dim=-1)
        values = torch.randn(2, 40, 8)
        keep = torch.rand(2, 40) < 0.4
        keep[:, 0] = True
        loss, bound = scores.eviction_l1(attn, values, keep)
        assert loss.shape == bound.shape == (6, 5)
        assert (loss <= bound + 1e-5).all()
    loss, bound = scores.eviction_l1(attn, values, torch.ones(2, 40, dtype=torch.bool))
    assert loss.abs().max() < 1e-5 and bound.abs().max() < 1e-5


def test_per_head_compaction_equals_masked_reference():
    torch.manual_seed(2)
    hkv, hq, t, d = 2, 6, 25, 8
    kv = LayerKV(torch.randn(hkv, t, d), torch.randn(hkv, t, d), torch.arange(t))
    keep = torch.rand(hkv, t) < 0.5
    keep[:, 0] = True
    small, idx, valid = keep_slots(kv, keep)
    assert small.num_tokens == int(keep.sum(1).max()) < t
    assert small.positions.shape == (hkv, small.num_tokens)
    q = torch.randn(hq, 3, d)
    q_pos = torch.tensor([30, 31, 32])
    ref = attend(q, kv.keys, kv.values, q_pos, kv.positions, d ** -0.5, head_mask=keep)
    out = attend(q, small.keys, small.values, q_pos, small.positions, d ** -0.5, small.head_mask)
    assert torch.allclose(ref, out, atol=1e-5)
    # appending after a per-head compaction keeps working
    small.append(torch.randn(hkv, 1, d), torch.randn(hkv, 1, d), torch.tensor([33]))
    assert small.positions.shape == (hkv, small.num_tokens) and bool(small.head_mask[:, -1].all())


def test_compact_positions_keeps_attention():
    torch.manual_seed(3)
    d = 16
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    positions = torch.tensor([0, 1, 50, 51, 52, 90])
    raw_k, q = torch.randn(1, 6, d), torch.randn(1, 1, d)
    keys = apply_rope(raw_k, *rope_cos_sin(positions, inv_freq))
    kv = compact_positions(LayerKV(keys, torch.randn(1, 6, d), positions), inv_freq)
    assert kv.positions.tolist() == [85, 86, 87, 88, 89, 90]
    expected = apply_rope(raw_k, *rope_cos_sin(kv.positions, inv_freq))
    assert torch.allclose(kv.keys, expected, atol=1e-4)
    w = attention_weights(apply_rope(q, *rope_cos_sin(torch.tensor([91]), inv_freq)), kv.keys, torch.tensor([91]),
                          kv.positions, d ** -0.5)
    assert torch.isfinite(w).all()
