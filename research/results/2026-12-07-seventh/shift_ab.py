"""Shift + fuse stage time of blend@0.15 over 8 pre-RoPE chunks of 128 tokens (the default codec's key form),
median of 10 prefills. Run once per checkout (PYTHONPATH picks it) and alternate, on an otherwise idle box."""
import json, statistics, sys, time
import torch
from prompt import blend_prompt
from workers.pipeline import run_prefill
from workers.modes import plan_for
from workers.blend import BlendConfig
import workers.pipeline as pipeline
r, layout, held = blend_prompt()
plan = plan_for("blend", BlendConfig(recompute_ratio=0.15))
rows = []
for _ in range(11):
    t = time.perf_counter(); out = run_prefill(r, layout, plan, held); total = time.perf_counter() - t
    rows.append({**out.stats.breakdown, "total": total})
rows = rows[1:]
med = {k: round(statistics.median(row[k] for row in rows) * 1e3, 1) for k in rows[0]}
med["shift+fuse"] = round(statistics.median(row["shift"] + row["fuse"] for row in rows) * 1e3, 1)
print(json.dumps({"checkout": pipeline.__file__, "ms": med}))
