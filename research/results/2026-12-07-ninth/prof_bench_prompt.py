"""Profile one prefill (the blend bench's first prompt: 8 chunks of CHUNK_TOKENS) by op, bf16 kernel, held KV
(pre-RoPE keys, the default codec's form). argv: chunk_tokens ratio [mode]."""
import sys, time, statistics, torch
from bench_prompt import bench_prompt
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
chunk_tokens, ratio = int(sys.argv[1]), float(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else "blend"
r, layout, held = bench_prompt(chunk_tokens)
plans = {"full": plan_for("full", BlendConfig()), "blend": plan_for("blend", BlendConfig(recompute_ratio=ratio)),
         "reuse": plan_for("reuse", BlendConfig())}
times = {k: [] for k in plans}
for _ in range(3):
    for k, plan in plans.items():
        t = time.perf_counter(); out = run_prefill(r, layout, plan, held); times[k].append(time.perf_counter() - t)
print("tokens", layout.num_tokens, {k: round(statistics.median(v), 3) for k, v in times.items()},
      "speedup", round(statistics.median(times["full"]) / statistics.median(times["blend"]), 2))
with torch.profiler.profile(record_shapes=True) as p:
    run_prefill(r, layout, plans[mode], held)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=40, max_shapes_column_width=80))
