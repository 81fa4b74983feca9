"""Profile one blend@0.15 prefill (1,120 tokens, 8 chunks of 128) by op, and time its parts."""
import sys, time, torch
from prompt import blend_prompt
from workers.pipeline import run_prefill
from workers.modes import plan_for
from workers.blend import BlendConfig
ratio = float(sys.argv[1]) if len(sys.argv) > 1 else 0.15
r, layout, held = blend_prompt(pre_rope=False)
print("tokens", layout.num_tokens)
plans = {"full": plan_for("full", BlendConfig()), "reuse": plan_for("reuse", BlendConfig()),
         str(ratio): plan_for("blend", BlendConfig(recompute_ratio=ratio))}
for _ in range(2):
    for name, plan in plans.items():
        t = time.perf_counter(); out = run_prefill(r, layout, plan, held); dt = time.perf_counter() - t
        print(name, round(dt, 3), {k: round(v, 3) for k, v in out.stats.breakdown.items()}, round(out.stats.compute_fraction, 3))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as p:
    run_prefill(r, layout, plans[str(ratio)], held)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=25))
