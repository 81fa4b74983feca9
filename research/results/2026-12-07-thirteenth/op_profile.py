"""Where full's and blend@RATIO's prefill time goes, by torch op (torch.profiler on the scheduler's thread), over the
bench's prompts (the ninth session's set-up). op_profile.py [--shapes] MODE... (full, reuse or a ratio; --shapes:
grouped by input shape, one round). op_profile.log: full 0.15; op_shapes-0.15.log: --shapes 0.15."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from torch.profiler import profile, ProfilerActivity
from engine_prompts import engine_and_prompts, mode_plans, prefill_on_thread
from workers.pipeline import run_prefill

shapes = "--shapes" in sys.argv
modes = [m for m in sys.argv[1:] if m != "--shapes"] or ["full", "0.15"]
rounds = 1 if shapes else 2
eng, layouts = engine_and_prompts()
plans = mode_plans()
for m in modes:
    plan = plans[m if m in plans else float(m)]
    for layout in layouts:  # warm
        prefill_on_thread(eng, layout, plan)

    def one():  # the profiler runs on the scheduler's thread
        with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as p:
            for _ in range(rounds):
                for layout in layouts:
                    source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
                    run_prefill(eng.runner, layout, plan, source, eng.config.chunk_form)
        return p

    p = eng.scheduler.call(one)
    print(f"==== {m} (per prefill = total / {rounds * len(layouts)})")
    table = p.key_averages(group_by_input_shape=shapes)
    print(table.table(sort_by="self_cpu_time_total", row_limit=40 if shapes else 25, max_name_column_width=30,
                      max_shapes_column_width=70))
eng.close()
