"""The bf16 row-attention kernel against the fp32 one: error (vs fp64 reference) and time, at blend@0.15's rows
(185 scattered over 1,116), blend@0.5's (560) and a whole causal prompt (1,116), SmolLM2's heads (9 over 3, 64)."""
import statistics, time, torch
from workers import row_attention as ra

torch.manual_seed(0)
H, HKV, D, T = 9, 3, 64, 1116
keys, values = torch.randn(HKV, T, D) * 2, torch.randn(HKV, T, D)


def med(fn, k=30):
    ts = []
    for _ in range(k):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def reference(q, first, end, scale):
    out = torch.empty(q.shape[1], H * D, dtype=torch.float64)
    k, v = keys.double().repeat_interleave(H // HKV, 0), values.double().repeat_interleave(H // HKV, 0)
    s = (q.double() @ k.transpose(1, 2)) * scale  # [H, S, T]
    idx = torch.arange(T)
    mask = (idx[None] >= first[:, None].long()) & (idx[None] < end[:, None].long())
    s = s.masked_fill(~mask[None], float("-inf")).softmax(-1)
    return (s @ v).transpose(0, 1).reshape(q.shape[1], H * D)


for name, rows in [("0.15", 185), ("0.5", 560), ("full", T)]:
    pos = torch.arange(T) if rows == T else torch.sort(torch.randperm(T)[:rows]).values
    q = torch.randn(H, rows, D)
    first, end = torch.zeros(rows, dtype=torch.int32), (pos + 1).to(torch.int32)
    ref = reference(q, first, end, 0.125)
    a, b = ra.attend_rows(q, keys, values, first, end, 0.125), ra.attend_rows(q, keys, values, first, end, 0.125, bf16=True)
    ea, eb = (a.double() - ref).abs().max().item(), (b.double() - ref).abs().max().item()
    ta = med(lambda: ra.attend_rows(q, keys, values, first, end, 0.125))
    tb = med(lambda: ra.attend_rows(q, keys, values, first, end, 0.125, bf16=True))
    print(f"{name:>5} rows {rows}: fp32 {ta:6.2f} ms (err {ea:.1e})  bf16 {tb:6.2f} ms (err {eb:.1e})  {ta / tb:.2f}x")
