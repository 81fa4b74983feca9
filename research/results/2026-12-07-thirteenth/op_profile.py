"""Where full's and blend@0.15's prefill time goes, by torch op (torch.profiler on the scheduler's thread), over the
bench's prompts (the ninth session's set-up)."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
import torch
from torch.profiler import profile, ProfilerActivity
from engine_prompts import engine_and_prompts, mode_plans, prefill_on_thread

eng, layouts = engine_and_prompts()
plans = mode_plans()
for m in sys.argv[1:] or ["full", "0.15"]:
    key = m if m in plans else float(m)
    plan = plans[key]
    for layout in layouts:  # warm
        prefill_on_thread(eng, layout, plan)
    def one():
        with profile(activities=[ProfilerActivity.CPU]) as p:
            from workers.pipeline import run_prefill
            for _ in range(2):
                for layout in layouts:
                    source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
                    run_prefill(eng.runner, layout, plan, source, eng.config.chunk_form)
        return p
    p = eng.scheduler.call(one)
    print(f"==== {m} (per prefill = total / {2 * len(layouts)})")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
eng.close()
