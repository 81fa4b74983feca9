"""RoPE math (kvstore/rope.py): the half-by-half rotation and the position table."""

from __future__ import annotations

import torch

from kvstore.rope import RopeTable, apply_rope, rope_cos_sin, rotate_half


def inv_freq(dim: int) -> torch.Tensor:
    return 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)


def test_apply_rope_is_the_rotate_half_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 17, 64, generator=g)  # [H, T, D]
    cos, sin = rope_cos_sin(torch.arange(100, 117), inv_freq(64))
    torch.testing.assert_close(apply_rope(x, cos, sin), x * cos + rotate_half(x) * sin, atol=1e-6, rtol=1e-6)
    # fp32 tables lift an fp16 x; the result comes back in x's dtype
    out = apply_rope(x.half(), cos, sin)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), (x.half().float() * cos + rotate_half(x.half().float()) * sin),
                               atol=2e-3, rtol=1e-3)
    # per-entry tables broadcast against x (a compressed chunk's heads at their own positions)
    per_entry = torch.randint(0, 500, (3, 17))
    cos, sin = rope_cos_sin(per_entry, inv_freq(64))
    torch.testing.assert_close(apply_rope(x, cos, sin), x * cos + rotate_half(x) * sin, atol=1e-6, rtol=1e-6)


def test_rope_table_gives_rope_cos_sin_bit_for_bit_and_grows():
    freq = inv_freq(64)
    table = RopeTable(freq, scale=1.25, dtype=torch.float16)
    small = torch.tensor([0, 5, 3])
    cos, sin = table(small)
    assert table.table[0].shape[0] == 64  # the first table covers 64 positions
    ref_cos, ref_sin = rope_cos_sin(small, freq)
    assert torch.equal(cos, (ref_cos * 1.25).half()) and torch.equal(sin, (ref_sin * 1.25).half())
    far = torch.tensor([[7, 2000], [64, 1]])  # grows past what it held; any leading shape
    cos, sin = table(far)
    assert cos.shape == (2, 2, 64) and table.table[0].shape[0] >= 2001
    ref_cos, ref_sin = rope_cos_sin(far, freq)
    assert torch.equal(cos, (ref_cos * 1.25).half()) and torch.equal(sin, (ref_sin * 1.25).half())
    assert table(torch.tensor([], dtype=torch.long))[0].shape == (0, 64)
