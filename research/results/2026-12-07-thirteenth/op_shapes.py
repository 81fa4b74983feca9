"""blend@RATIO's torch ops by input shape (torch.profiler on the scheduler's thread), the bench's prompts."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from torch.profiler import profile, ProfilerActivity
from engine_prompts import engine_and_prompts, mode_plans
from workers.pipeline import run_prefill

eng, layouts = engine_and_prompts()
plans = mode_plans()
m = sys.argv[1] if len(sys.argv) > 1 else "0.15"
plan = plans[m if m in plans else float(m)]


def one():
    for layout in layouts:  # warm
        run_prefill(eng.runner, layout, plan, eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False), eng.config.chunk_form)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for layout in layouts:
            source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
            run_prefill(eng.runner, layout, plan, source, eng.config.chunk_form)
    return p


p = eng.scheduler.call(one)
print(f"==== {m} (totals over {len(layouts)} prefills)")
print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=30, max_shapes_column_width=70))
eng.close()
