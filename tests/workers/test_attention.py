"""workers/attention.py: the causal fast path equals the position-masked attention it replaces."""

import torch
import torch.nn.functional as F

from workers.attention import attend, is_causal_layout, visibility_mask


def _masked(q, k, v, qp, kp, scale):
    mask = visibility_mask(qp, kp, None, q.shape[0])[None]
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[1], -1)


def test_causal_layout_is_only_a_prefill_over_its_own_tokens():
    p = torch.arange(10)
    assert is_causal_layout(p, p)
    assert not is_causal_layout(p[4:], p)  # a continuation: fewer queries than cached tokens
    assert not is_causal_layout(p.flip(0), p.flip(0))  # positions not increasing
    assert not is_causal_layout(p, p[None].expand(3, -1))  # per-head positions
    assert not is_causal_layout(p[:1], p[:1])


def test_causal_fast_path_equals_the_masked_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(9, 70, 64), torch.randn(3, 70, 64), torch.randn(3, 70, 64)
    p = torch.arange(5, 75)  # a chunk's own positions, not starting at 0
    torch.testing.assert_close(attend(q, k, v, p, p, 0.125), _masked(q, k, v, p, p, 0.125), atol=1e-5, rtol=1e-4)
