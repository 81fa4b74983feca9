"""The row kernel (workers/row_attention.c) against SDPA's plans (attention.plan_attention as of the ninth
session), alternated in one process: whole prompts in order (SDPA's causal path) and blend-like scattered rows
(the block plan), SmolLM2's 9 query / 3 kv heads of 64."""
import statistics, time, torch
from workers.attention import plan_attention
from workers.row_attention import attend_rows
torch.manual_seed(0)
def cases():
    for T in (128, 512, 1116, 2118, 4096):
        yield f"prompt {T} in order", torch.arange(T), T
    for T, rows in ((1116, 25), (1116, 185), (1116, 350), (1116, 560), (2118, 340)):
        w = torch.arange(T - 25).float() + 200  # skewed late, as gradual's choice is; plus the 25-token question
        qp = torch.cat([torch.sort(torch.multinomial(w, rows - 25)).values, torch.arange(T - 25, T)]) if rows > 25 else torch.arange(T - 25, T)
        yield f"{rows} of {T} scattered", qp, T
for name, qp, T in cases():
    kp = torch.arange(T)
    k, v, q = torch.randn(3, T, 64), torch.randn(3, T, 64), torch.randn(9, qp.numel(), 64)
    plan = plan_attention(qp, kp, None, 9, None, torch.float32, blocks=True, rows=False)
    end = torch.searchsorted(kp, qp, right=True).int(); first = torch.zeros_like(end)
    ref, got = plan.run(q, k, v, 0.125), attend_rows(q, k, v, first, end, 0.125)
    err = (ref - got).abs().max().item()
    fns = {"sdpa": lambda: plan.run(q, k, v, 0.125), "rows": lambda: attend_rows(q, k, v, first, end, 0.125)}
    ts = {n: [] for n in fns}
    n = max(5, min(60, int(2e7 / (qp.numel() * T))))
    for _ in range(n):
        for k_, f in fns.items():
            t = time.perf_counter(); f(); ts[k_].append(time.perf_counter() - t)
    exact = int(end.sum())
    s, r = statistics.median(ts["sdpa"]), statistics.median(ts["rows"])
    print(f"{name:24s} sdpa {s*1e3:7.2f} ms ({s/exact*1e9:4.1f} ns/key-row)  rows {r*1e3:7.2f} ms ({r/exact*1e9:4.1f})  x{s/r:.2f}  max err {err:.1e}")
