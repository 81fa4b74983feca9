import torch, time
import torch.nn.functional as F
from workers.attention import attend, visibility_mask, query_blocks
torch.manual_seed(0)
T, Hq, Hkv, D = 1074, 9, 3, 64
keys = torch.randn(Hkv, T, D); values = torch.randn(Hkv, T, D)
kvpos = torch.arange(T)
def mins(fs, n=15):
    best = {k: 1e9 for k in fs}
    for _ in range(n):
        for k, f in fs.items():
            t = time.perf_counter(); f(); best[k] = min(best[k], time.perf_counter() - t)
    return {k: round(v * 1e3, 2) for k, v in best.items()}
qf = torch.randn(Hq, T, D)
print("full causal", mins({"causal": lambda: attend(qf, keys, values, kvpos, kvpos, 0.125)}))
for S in (190, 300, 505):
    sel = torch.sort(torch.randperm(1000)[:S - 25] + 50).values
    qpos = torch.cat([sel, torch.arange(T - 25, T)])
    q = torch.randn(Hq, S, D)
    blocks = query_blocks(qpos, kvpos)
    def blocked():
        for a, b, lo, hi in blocks:
            mask = visibility_mask(qpos[a:b], kvpos[lo:hi], None, Hq)[None]
            F.scaled_dot_product_attention(q[None, :, a:b], keys[None, :, lo:hi], values[None, :, lo:hi], attn_mask=mask, scale=0.125, enable_gqa=True)
    def dense():
        mask = visibility_mask(qpos, kvpos, None, Hq)[None]
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, scale=0.125, enable_gqa=True)
    def manual():
        g = Hq // Hkv
        sc = torch.matmul(q.view(Hkv, g * S, D), keys.transpose(1, 2)).view(Hkv, g, S, T)
        sc.masked_fill_((kvpos[None, :] > qpos[:, None]), float("-inf"))
        w = torch.softmax(sc.mul_(0.125), -1).view(Hkv, g * S, T)
        return torch.bmm(w, values)
    fs = {"dense": dense, "manual": manual}
    if blocks: fs["blocked"] = blocked
    print(S, len(blocks or []), mins(fs))
