"""blend@0.15's prefill time against the query block size of workers/attention.py (64 today), alternating
in one process over 8 x 128 pre-RoPE chunks; median of 8 prefills each."""
import statistics, time, torch
import workers.attention as att
from prompt import blend_prompt
from workers.pipeline import run_prefill
from workers.modes import plan_for
from workers.blend import BlendConfig
r, layout, held = blend_prompt()
plan = plan_for("blend", BlendConfig(recompute_ratio=0.15))
orig = att.query_blocks
sizes = (16, 32, 64, 128)
res = {s: [] for s in sizes}
run_prefill(r, layout, plan, held)
for i in range(8):
    for s in sizes:
        att.query_blocks = lambda q, kv, rows=64, window=None, s=s: orig(q, kv, s, window)
        t = time.perf_counter(); run_prefill(r, layout, plan, held); res[s].append(time.perf_counter() - t)
print({s: round(statistics.median(v) * 1e3, 1) for s, v in res.items()})
