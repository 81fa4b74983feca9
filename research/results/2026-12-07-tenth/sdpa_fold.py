"""SDPA with the query heads of each KV head folded into its rows ([Hkv, g*m, D], the mask repeated g times)
against SDPA's own GQA ([Hq, m, D] over [Hkv, T, D]), ns per key-row, fp32, masked as blend's blocks are."""
import torch
import torch.nn.functional as F
from timing import med
torch.manual_seed(0)
for m, T in ((16, 174), (16, 440), (32, 440), (32, 639), (48, 901), (57, 1116), (64, 1116), (96, 1116), (128, 1116), (185, 1116)):
    q, k, v = torch.randn(9, m, 64), torch.randn(3, T, 64), torch.randn(3, T, 64)
    mask = torch.zeros(1, 1, m, T); mask[..., T - m:] = torch.full((m, m), float("-inf")).triu(1)
    gqa = lambda: F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=0.125, enable_gqa=True)
    mask3 = mask.repeat(1, 1, 3, 1)
    fold = lambda: F.scaled_dot_product_attention(q.reshape(3, 3 * m, 64)[None], k[None], v[None], attn_mask=mask3, scale=0.125)
    a, b = gqa(), fold().reshape(1, 9, m, 64)
    assert (a - b).abs().max() < 1e-5, (a - b).abs().max()
    tg, tf = med(gqa, 40), med(fold, 40)
    print(f"m={m:4d} T={T:5d}: gqa {tg/(m*T)*1e9:5.1f}  folded {tf/(m*T)*1e9:5.1f} ns/key-row  x{tg/tf:.2f}")
