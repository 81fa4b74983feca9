"""placement.place (workers/placement.py, rotary.c): a stored chunk written into a prompt's cache with its
drift, rotation and copy in one pass, the same values as the torch ops (drifted, keys_at, copy) it replaces."""

from __future__ import annotations

import pytest
import torch

from kvstore.kv import ChunkKV
from workers import placement, rotary
from workers.context_drift import ContextDrift, drifted

L, H, T, P = 3, 2, 7, 40


def _inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))


def _chunk(dim: int, pre_rope: bool, inv_freq: torch.Tensor, seed: int = 0) -> ChunkKV:
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(L, H, T, dim, generator=g), torch.randn(L, H, T, dim, generator=g)
    return ChunkKV(keys, values, list(range(T)), pre_rope=pre_rope, inv_freq=inv_freq)


def _drift(dim: int) -> ContextDrift:
    g = torch.Generator().manual_seed(9)
    return ContextDrift(keys=torch.randn(2, L, H, dim, generator=g) * 0.3, values=torch.randn(2, L, H, dim, generator=g) * 0.3)


def _by_torch(chunk: ChunkKV, start: int, inv_freq, drift, slot) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: the torch ops the pass replaces, into fresh buffers."""
    keys, values = torch.full((L, H, P, chunk.keys.shape[-1]), 5.0), torch.full((L, H, P, chunk.keys.shape[-1]), 5.0)
    if drift is not None:
        chunk = drifted(chunk, slot, drift, inv_freq)
    keys[:, :, start:start + T] = chunk.keys_at(start, inv_freq, torch.float32)
    values[:, :, start:start + T] = chunk.values
    return keys, values


needs_kernel = pytest.mark.skipif(rotary.unavailable() is not None, reason=f"{rotary.unavailable()}")


@needs_kernel
@pytest.mark.parametrize("dim", [64, 256, 16])
@pytest.mark.parametrize("pre_rope, with_drift", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("start", [0, 3, P - T])
def test_the_pass_places_what_the_torch_ops_place(dim, pre_rope, with_drift, start):
    """Pre-RoPE keys rotated at start + i, post-RoPE keys moved by start, values copied, each shifted by the
    slot's drift when given; only the chunk's span of the buffers is written, the chunk never."""
    inv_freq = _inv_freq(dim)
    chunk = _chunk(dim, pre_rope, inv_freq)
    before = chunk.keys.clone(), chunk.values.clone()
    drift = _drift(dim) if with_drift else None
    for slot in (0, 1):
        keys, values = torch.full((L, H, P, dim), 5.0), torch.full((L, H, P, dim), 5.0)
        assert placement.runs_native(keys, values, chunk, drift)
        placement.place(keys, values, start, chunk, inv_freq, drift, slot)
        want_keys, want_values = _by_torch(chunk, start, inv_freq, drift, slot)
        torch.testing.assert_close(keys, want_keys, rtol=0, atol=2e-6)  # the same ops; bit for bit on x86 so far
        torch.testing.assert_close(values, want_values, rtol=0, atol=0)
    assert torch.equal(chunk.keys, before[0]) and torch.equal(chunk.values, before[1])


@needs_kernel
def test_per_layer_frequencies_rotate_each_layer_by_its_own():
    """Gemma 3: local and global layers rotate with different bases (inv_freq [L, 1, 1, D/2])."""
    dim = 32
    inv_freq = torch.stack([_inv_freq(dim, base) for base in (10000.0, 1e6, 10000.0)]).reshape(L, 1, 1, dim // 2)
    chunk = _chunk(dim, True, inv_freq)
    drift = _drift(dim)
    keys, values = torch.zeros(L, H, P, dim), torch.zeros(L, H, P, dim)
    placement.place(keys, values, 11, chunk, inv_freq, drift, 1)
    want_keys, want_values = _by_torch(chunk, 11, inv_freq, drift, 1)
    torch.testing.assert_close(keys[:, :, 11:11 + T], want_keys[:, :, 11:11 + T], rtol=0, atol=2e-6)
    torch.testing.assert_close(values[:, :, 11:11 + T], want_values[:, :, 11:11 + T], rtol=0, atol=0)


@needs_kernel
def test_a_cache_view_with_a_larger_capacity_is_written_in_place():
    """The buffers may be views of larger ones (a head stride of capacity x D): entries land where the view says."""
    dim, inv_freq = 64, _inv_freq(64)
    chunk = _chunk(dim, True, inv_freq)
    big_k, big_v = torch.zeros(L, H, P + 9, dim), torch.zeros(L, H, P + 9, dim)
    keys, values = big_k[:, :, :P], big_v[:, :, :P]
    assert placement.runs_native(keys, values, chunk, None)
    placement.place(keys, values, 4, chunk, inv_freq)
    want_keys, want_values = _by_torch(chunk, 4, inv_freq, None, 1)
    torch.testing.assert_close(big_k[:, :, 4:4 + T], want_keys[:, :, 4:4 + T], rtol=0, atol=2e-6)
    assert torch.equal(big_v[:, :, 4:4 + T], want_values[:, :, 4:4 + T])
    assert not big_k[:, :, :4].any() and not big_k[:, :, 4 + T:].any()


def test_what_the_pass_cannot_take_goes_the_torch_way():
    """bf16 buffers, post-RoPE keys with a drift, a head size that is not a multiple of 16: the torch path."""
    inv_freq = _inv_freq(64)
    pre, post, odd = _chunk(64, True, inv_freq), _chunk(64, False, inv_freq), _chunk(8, True, _inv_freq(8))
    half = torch.zeros(L, H, P, 64, dtype=torch.bfloat16), torch.zeros(L, H, P, 64, dtype=torch.bfloat16)
    assert not placement.runs_native(*half, pre, None)
    assert not placement.runs_native(torch.zeros(L, H, P, 64), torch.zeros(L, H, P, 64), post, _drift(64))
    assert not placement.runs_native(torch.zeros(L, H, P, 8), torch.zeros(L, H, P, 8), odd, None)
    placement.place(*half, 2, pre, inv_freq, _drift(64), 0)
    want_keys, _ = _by_torch(pre, 2, inv_freq, _drift(64), 0)
    torch.testing.assert_close(half[0][:, :, 2:2 + T].float(), want_keys[:, :, 2:2 + T], rtol=1e-2, atol=2e-2)
    keys, values = torch.zeros(L, H, P, 64), torch.zeros(L, H, P, 64)
    placement.place(keys, values, 5, post, inv_freq, _drift(64), 1)
    want_keys, want_values = _by_torch(post, 5, inv_freq, _drift(64), 1)
    assert torch.equal(keys, torch.where(want_keys == 5.0, 0.0, want_keys))


@pytest.mark.parametrize("start", [-1, P - T + 1])
def test_a_chunk_that_does_not_fit_is_refused(start):
    inv_freq = _inv_freq(64)
    with pytest.raises(ValueError, match="does not fit"):
        placement.place(torch.zeros(L, H, P, 64), torch.zeros(L, H, P, 64), start, _chunk(64, True, inv_freq), inv_freq)
    with pytest.raises(ValueError, match="does not fit"):  # other layers or heads than the cache's
        placement.place(torch.zeros(L, H + 1, P, 64), torch.zeros(L, H + 1, P, 64), 0, _chunk(64, True, inv_freq), inv_freq)


@needs_kernel
def test_frequencies_or_a_drift_of_another_shape_are_refused_not_read_past():
    """The C pass reads whole tables: RoPE frequencies or a drift that do not fit the keys are an error."""
    inv_freq = _inv_freq(64)
    chunk = _chunk(64, True, inv_freq)
    keys, values = torch.zeros(L, H, P, 64), torch.zeros(L, H, P, 64)
    other = ChunkKV(chunk.keys, chunk.values, chunk.token_ids, pre_rope=True, inv_freq=_inv_freq(32))
    with pytest.raises(ValueError, match="frequencies"):
        placement.place(keys, values, 0, other, inv_freq)
    small = ContextDrift(keys=torch.zeros(2, L, H - 1, 64), values=torch.zeros(2, L, H - 1, 64))
    with pytest.raises(ValueError, match="drift"):
        placement.place(keys, values, 0, chunk, inv_freq, small, 1)
