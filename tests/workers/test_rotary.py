"""rotary.rotate_rows (workers/rotary.py, rotary.c): a pass's queries or keys rotated at their positions in one C
call, the same values as apply_rope over the positions' rows of the runner's table; the runner uses it."""

from __future__ import annotations

import pytest
import torch

from kvstore.rope import RopeTable, apply_rope
from workers import rotary

needs_kernel = pytest.mark.skipif(rotary.unavailable() is not None, reason=f"{rotary.unavailable()}")


def _table(dim: int, scale: float = 1.0) -> RopeTable:
    return RopeTable(1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)), scale)


@needs_kernel
@pytest.mark.parametrize("heads, dim", [(9, 64), (3, 64), (4, 256), (2, 16)])
@pytest.mark.parametrize("seq", [1, 5, 300])
def test_rows_rotate_as_apply_rope_does(heads, dim, seq):
    """Rows of a projection's output (a view: the next heads' columns follow each row), at scattered positions
    in any order, with a scaled table (Gemma 3's attention scaling)."""
    g = torch.Generator().manual_seed(seq + heads)
    wide = torch.randn(seq, (heads + 3) * dim, generator=g)
    x = wide[:, : heads * dim].reshape(seq, heads, dim)  # row stride (heads + 3) * dim
    positions = torch.randperm(2000, generator=g)[:seq]
    table = _table(dim, scale=0.9)
    cos, sin = table.covering(positions)
    assert rotary.rows_fit(x, cos)
    got = rotary.rotate_rows(x, positions, cos, sin)
    want = apply_rope(x.transpose(0, 1), cos[positions], sin[positions])
    assert got.shape == (heads, seq, dim) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)  # the same ops; bit for bit on x86 so far


@needs_kernel
def test_a_position_outside_the_table_is_refused():
    table = _table(64)
    cos, sin = table.covering(torch.tensor([10]))
    x = torch.randn(2, 3, 64)
    with pytest.raises(ValueError, match="outside a table"):
        rotary.rotate_rows(x, torch.tensor([3, cos.shape[0]]), cos, sin)
    with pytest.raises(ValueError, match="outside a table"):
        rotary.rotate_rows(x, torch.tensor([-1, 2]), cos, sin)


def test_what_the_pass_cannot_take_is_not_offered_to_it():
    cos, _ = _table(64).covering(torch.tensor([4]))
    assert not rotary.rows_fit(torch.randn(4, 3, 64).to(torch.bfloat16), cos)  # half precision
    assert not rotary.rows_fit(torch.randn(4, 3, 8), _table(8).covering(torch.tensor([4]))[0])  # D not a multiple of 16
    assert not rotary.rows_fit(torch.randn(3, 4, 64).transpose(0, 1), cos)  # heads not side by side
    assert not rotary.rows_fit(torch.randn(4, 3, 64), cos.to(torch.bfloat16))  # a half-precision table


@pytest.mark.parametrize("model", ["runner", "gemma_runner"])
def test_the_runners_rotation_is_apply_ropes(model, request):
    """runner.qkv's queries and keys: the C pass where it runs (SmolLM2's 64-wide heads, Gemma 3's 256 after its
    q/k norms), within 2e-6 of apply_rope over the same rows."""
    runner = request.getfixturevalue(model)
    layer, positions = 1, torch.tensor([0, 3, 4, 9, 30, 31])
    normed = torch.randn(len(positions), runner.model.config.hidden_size, generator=torch.Generator().manual_seed(2))
    q, k, v = runner.qkv(layer, normed, positions)
    head_dim = runner.shape.head_dim
    raw_q, raw_k, _ = (x.reshape(len(positions), -1, head_dim) for x in runner.projections.qkv(layer, normed))
    attn = runner.layers[layer].self_attn
    if getattr(attn, "q_norm", None) is not None:
        raw_q, raw_k = attn.q_norm(raw_q), attn.k_norm(raw_k)
    cos, sin = runner.rope_cache[runner.rope.index[layer]](positions)
    torch.testing.assert_close(q, apply_rope(raw_q.transpose(0, 1), cos, sin), rtol=0, atol=2e-6)
    torch.testing.assert_close(k, apply_rope(raw_k.transpose(0, 1), cos, sin), rtol=0, atol=2e-6)
