"""Drift (research/ragkv_research/drift.py): the pre-RoPE shift is measured per chunk exactly and applied at each key's position."""

import torch

from kvstore.rope import rerotate_keys as rotate
from ragkv_research.drift import chunk_index, chunk_means, key_drift, shift_keys, shift_values, value_drift

INV_FREQ = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))  # head dim 16


def test_each_chunks_pre_rope_shift_is_recovered_and_applied_at_every_position():
    gen = torch.Generator().manual_seed(0)
    pre = torch.randn(3, 10, 16, generator=gen)  # [H, T, D]
    shifts = torch.randn(3, 2, 16, generator=gen)  # two chunks: tokens 0-4 and 5-9
    chunk_of = torch.tensor([0] * 5 + [1] * 5)
    positions = torch.arange(40, 50)
    stored = rotate(pre, positions, INV_FREQ)
    fresh = rotate(pre + shifts[:, chunk_of], positions, INV_FREQ)
    drift = key_drift(fresh, stored, positions, INV_FREQ, chunk_of, 2)
    assert torch.allclose(drift, shifts, atol=1e-5)
    assert torch.allclose(shift_keys(stored, drift[:, chunk_of], positions, INV_FREQ), fresh, atol=1e-5)


def test_values_shift_without_rotation():
    stored = torch.randn(2, 4, 16)
    fresh = stored + 0.25
    drift = value_drift(fresh, stored, torch.zeros(4, dtype=torch.long), 1)
    assert torch.allclose(drift, torch.full((2, 1, 16), 0.25), atol=1e-6)
    assert torch.allclose(shift_values(stored, drift[:, [0, 0, 0, 0]]), fresh, atol=1e-6)


def test_a_chunk_with_nothing_measured_takes_the_mean_over_all():
    diff = torch.stack([torch.full((3, 16), 1.0), torch.full((3, 16), 3.0)], dim=1)  # [H=3, T=2, D]
    means = chunk_means(diff, torch.tensor([0, 2]), 3)  # chunk 1 has no token
    assert torch.allclose(means[:, 0], torch.ones(3, 16)) and torch.allclose(means[:, 2], torch.full((3, 16), 3.0))
    assert torch.allclose(means[:, 1], torch.full((3, 16), 2.0))


def test_entries_a_head_does_not_hold_are_left_out_of_the_drift():
    """Chunks compressed at ingest hold different tokens per head; a dropped entry (stored as zeros)
    must not count as drift."""
    positions = torch.arange(4)
    stored = torch.zeros(2, 4, 16)
    fresh = rotate(torch.ones(2, 4, 16), positions, INV_FREQ)
    stored[:, :2] = rotate(torch.ones(2, 2, 16) - 0.5, positions[:2], INV_FREQ)  # held entries: drift 0.5
    held = torch.tensor([[True, True, False, False], [True, True, False, False]])
    drift = key_drift(fresh, stored, positions, INV_FREQ, torch.zeros(4, dtype=torch.long), 1, held)
    assert torch.allclose(drift, torch.full((2, 1, 16), 0.5), atol=1e-5)


def test_chunk_index_names_the_span_each_token_is_in():
    spans = [(3, 6), (7, 10), (10, 12)]
    assert chunk_index(torch.tensor([3, 5, 7, 9, 10, 11]), spans).tolist() == [0, 0, 1, 1, 2, 2]


def test_zero_drift_leaves_keys_unchanged():
    keys = torch.randn(2, 5, 16)
    assert torch.equal(shift_keys(keys, torch.zeros(2, 5, 16), torch.arange(5), INV_FREQ), keys)
