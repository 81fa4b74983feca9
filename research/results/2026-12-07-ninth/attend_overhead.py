"""attend()'s own cost around SDPA for blend@0.15's rows (185 of 1,116, 64-row blocks) and reuse's 25 rows:
today's call against the same SDPA calls with the block plan and float masks made beforehand."""
import statistics, time, torch
import torch.nn.functional as F
from workers.attention import attend, query_blocks, visibility_mask
torch.manual_seed(0)
T = 1116
k, v, kp = torch.randn(3, T, 64), torch.randn(3, T, 64), torch.arange(T)
def med(fn, n=200):
    fn(); ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6
for rows in (25, 185, 540):
    qp = torch.cat([torch.sort(torch.randperm(T - 25)[:rows - 25]).values, torch.arange(T - 25, T)]) if rows > 25 else torch.arange(T - 25, T)
    q = torch.randn(9, qp.numel(), 64)
    blocks = query_blocks(qp, kp) or [(0, qp.numel(), 0, T)]
    masks = [torch.zeros(1, 1, b - a, hi - lo).masked_fill_(~visibility_mask(qp[a:b], kp[lo:hi], None, 9)[None], float("-inf"))
             for a, b, lo, hi in blocks]
    def planned():
        outs = [F.scaled_dot_product_attention(q[None, :, a:b], k[None, :, lo:hi], v[None, :, lo:hi], attn_mask=m,
                                               scale=0.125, enable_gqa=True) for (a, b, lo, hi), m in zip(blocks, masks)]
        return torch.cat(outs, dim=2)[0].transpose(0, 1).reshape(qp.numel(), -1)
    torch.testing.assert_close(planned(), attend(q, k, v, qp, kp, 0.125), atol=0, rtol=0)
    a, b = med(lambda: attend(q, k, v, qp, kp, 0.125)), med(planned)
    print(f"{rows} rows, {len(blocks)} blocks: attend {a:.0f} us, planned {b:.0f} us, saved {a - b:.0f} us a layer")
