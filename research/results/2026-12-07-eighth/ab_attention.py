"""SDPA time and calls in one blend prefill per ratio on the bench's first prompt (torch profiler), this checkout.
Run from two checkouts (PYTHONPATH) to A/B an attention change: the query-block cost model was tried this way."""
import torch
from bench_prompt import bench_prompt
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill

r, layout, held = bench_prompt(128)
for ratio in (0.15, 0.3, 0.5):
    plan = plan_for("blend", BlendConfig(recompute_ratio=ratio))
    run_prefill(r, layout, plan, held)
    tot = {}
    for _ in range(3):
        with torch.profiler.profile() as p:
            run_prefill(r, layout, plan, held)
        for e in p.key_averages():
            if e.key in ("aten::scaled_dot_product_attention", "aten::where", "aten::le", "aten::cat"):
                tot.setdefault(e.key, []).append((round(e.cpu_time_total / 1e3, 1), e.count))
    print(ratio, tot)
