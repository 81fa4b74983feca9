"""Attention as two batched GEMMs with the 3 query heads of each KV head folded into rows (GQA), the mask
added by baddbmm, softmax in place: against SDPA's flash kernel, per key-row, for blend-sized blocks."""
import torch
import torch.nn.functional as F
from timing import med
torch.manual_seed(0)
def folded(q, k, v, mask, scale):
    # q [9, m, 64], k/v [3, T, 64], mask [m, T] additive -> [m, 9*64]
    hkv, T, D = k.shape; g = q.shape[0] // hkv; m = q.shape[1]
    qf = q.reshape(hkv, g * m, D)  # [3, 3m, D] (heads of a group stacked)
    s = torch.baddbmm(mask.repeat(1, g, 1) if mask is not None else torch.zeros(1, 1, 1), qf, k.transpose(1, 2), alpha=scale) if mask is not None else torch.bmm(qf, k.transpose(1, 2)).mul_(scale)
    s = torch.softmax(s, dim=-1)
    o = torch.bmm(s, v)  # [3, 3m, D]
    return o.reshape(hkv * g, m, D).transpose(0, 1).reshape(m, -1)
for dtype in (torch.float32,):
    for m, T in ((32, 440), (57, 1116), (64, 1116), (128, 1116), (185, 1116), (256, 1116)):
        q, k, v = torch.randn(9, m, 64, dtype=dtype), torch.randn(3, T, 64, dtype=dtype), torch.randn(3, T, 64, dtype=dtype)
        mask = torch.zeros(1, m, T, dtype=dtype)
        mask[0, :, T - m:] = torch.full((m, m), float("-inf")).triu(1)
        ref = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask[None], scale=0.125, enable_gqa=True)[0].transpose(0, 1).reshape(m, -1)
        got = folded(q, k, v, mask, 0.125)
        err = (ref - got).abs().max().item()
        ts = med(lambda: F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask[None], scale=0.125, enable_gqa=True))
        tf = med(lambda: folded(q, k, v, mask, 0.125))
        kr = m * T
        print(f"{dtype} m={m} T={T}: sdpa {ts/kr*1e9:.1f}  folded {tf/kr*1e9:.1f} ns/key-row  err {err:.1e}")
