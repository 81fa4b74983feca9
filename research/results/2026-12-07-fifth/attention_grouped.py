"""Blend-row attention: workers.attention.attend against a grouped-matmul path (whole and in query blocks)."""
import time, torch
from workers.attention import attend, visibility_mask
torch.manual_seed(0)
Hq, Hkv, D, T = 9, 3, 64, 1120
keys = torch.randn(Hkv, T, D); values = torch.randn(Hkv, T, D)
kvp = torch.arange(T)
def grouped(q, keys, values, qp, kvp, scale):
    Hq, S, D = q.shape; Hkv = keys.shape[0]; G = Hq // Hkv
    mask = kvp[None, :] <= qp[:, None]  # [S, T]
    bias = torch.zeros(S, keys.shape[1]).masked_fill_(~mask, float("-inf")).repeat(G, 1)  # [G*S, T]
    scores = torch.baddbmm(bias, q.reshape(Hkv, G * S, D), keys.transpose(1, 2), alpha=scale)
    probs = torch.softmax(scores, -1)
    out = torch.bmm(probs, values)  # [Hkv, G*S, D]
    return out.reshape(Hq, S, D).transpose(0, 1).reshape(S, Hq * D)
def grouped_blocks(q, keys, values, qp, kvp, scale, rows=64):
    S = q.shape[1]; outs = []
    for a in range(0, S, rows):
        b = min(S, a + rows); hi = int(qp[b-1]) + 1
        outs.append(grouped(q[:, a:b], keys[:, :hi], values[:, :hi], qp[a:b], kvp[:hi], scale))
    return torch.cat(outs)
def bench(f, n=20):
    f(); t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e3
for S in (25, 190, 360, 580):
    qp = torch.cat([torch.sort(torch.randperm(T - 25)[:S-25]).values, torch.arange(T-25, T)]) if S > 25 else torch.arange(T-25, T)
    q = torch.randn(Hq, S, D)
    ref = attend(q, keys, values, qp, kvp, 0.125)
    g = grouped(q, keys, values, qp, kvp, 0.125); gb = grouped_blocks(q, keys, values, qp, kvp, 0.125)
    assert torch.allclose(ref, g, atol=1e-4) and torch.allclose(ref, gb, atol=1e-4)
    print(f"S={S}: attend {bench(lambda: attend(q, keys, values, qp, kvp, 0.125)):.2f} ms, grouped {bench(lambda: grouped(q, keys, values, qp, kvp, 0.125)):.2f} ms, grouped blocks {bench(lambda: grouped_blocks(q, keys, values, qp, kvp, 0.125)):.2f} ms")
