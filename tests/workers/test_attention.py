"""workers/attention.py: the causal fast path equals the position-masked attention it replaces."""

import torch
import torch.nn.functional as F

from workers.attention import attend, causal_padding, visibility_mask


def _masked(q, k, v, qp, kp, scale):
    mask = visibility_mask(qp, kp, None, q.shape[0])[None]
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[1], -1)


def test_causal_padding_only_for_the_newest_tokens_in_order():
    p = torch.arange(40)
    assert causal_padding(p, p) == 0  # a prefill over an empty cache
    assert causal_padding(p[8:], p) == 8  # after a reused 8-token prefix
    assert causal_padding(p[20:], p) is None  # padding would cost more than a quarter of the queries
    assert causal_padding(p[8:30], p) is None  # not the newest tokens
    assert causal_padding(p.flip(0), p.flip(0)) is None  # positions not increasing
    assert causal_padding(p, p[None].expand(3, -1)) is None  # per-head positions
    assert causal_padding(p[:1], p[:1]) is None


def test_causal_fast_path_equals_the_masked_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(9, 70, 64), torch.randn(3, 70, 64), torch.randn(3, 70, 64)
    p = torch.arange(5, 75)  # a chunk's own positions, not starting at 0
    torch.testing.assert_close(attend(q, k, v, p, p, 0.125), _masked(q, k, v, p, p, 0.125), atol=1e-5, rtol=1e-4)
    tail = p[10:]  # after a reused prefix: padded with zero queries
    torch.testing.assert_close(attend(q[:, 10:], k, v, tail, p, 0.125), _masked(q[:, 10:], k, v, tail, p, 0.125),
                               atol=1e-5, rtol=1e-4)
