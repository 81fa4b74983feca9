"""One recomputing layer at blend@0.15's size (185 scattered rows over a 1,116-token fused cache), split into
its parts: the four bf16 GEMMs, attention, and the rest (norms, RoPE, cache writes, casts, residuals)."""
from pathlib import Path
import sys, time, statistics, torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-eighth"))  # the eighth session's prompt helper
from bench_prompt import bench_prompt  # noqa: E402
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.attention import attend
import torch.nn.functional as F

r, layout, held = bench_prompt(128)
out = run_prefill(r, layout, plan_for("full", BlendConfig()), held)
cache = out.cache
n = layout.num_tokens
g = torch.Generator().manual_seed(0)
rows = torch.sort(torch.randperm(n - 30, generator=g)[:155] + 30).values
rows = torch.sort(torch.cat([rows, torch.arange(n - 30, n)])).values.unique()
S = rows.numel()
hidden = torch.randn(S, r.shape.hidden_size)
pos = rows.clone()
L = 10
lay = r.projections.layers[L]

def med(fn, k=60):
    ts = []
    for _ in range(k):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3

with torch.inference_mode():
    xb = hidden.to(torch.bfloat16)
    hb = torch.randn(S, 1536).to(torch.bfloat16)
    layer = med(lambda: r.layer_forward(L, hidden, pos, cache, slots=rows))
    mms = med(lambda: (F.linear(xb, lay.qkv), F.linear(xb, lay.o), F.linear(xb, lay.gate_up), F.linear(hb, lay.down)))
    q, k, v = r.qkv(L, hidden, pos)
    kv = cache.layers[L]
    att = med(lambda: attend(q, kv.keys, kv.values, pos, kv.positions, 0.125))
    print(f"rows {S} tokens {n}: layer {layer:.2f} ms = gemms {mms:.2f} + attention {att:.2f} + rest {layer-mms-att:.2f}")
    with torch.profiler.profile() as p:
        for _ in range(10):
            r.layer_forward(L, hidden, pos, cache, slots=rows)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
