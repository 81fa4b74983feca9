"""cProfile of blend@RATIO prefills on the scheduler's thread (the bench's prompts): Python-level cumulative times."""
import cProfile, os, pstats, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts, mode_plans
from workers.pipeline import run_prefill

eng, layouts = engine_and_prompts()
m = sys.argv[1] if len(sys.argv) > 1 else "0.15"
plans = mode_plans()
plan = plans[m if m in plans else float(m)]


def one():
    go = lambda layout: run_prefill(eng.runner, layout, plan, eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False), eng.config.chunk_form)
    for layout in layouts:
        go(layout)
    p = cProfile.Profile()
    p.enable()
    for _ in range(2):
        for layout in layouts:
            go(layout)
    p.disable()
    return p


p = eng.scheduler.call(one)
print(f"==== {m}: 6 prefills")
pstats.Stats(p).sort_stats("cumulative").print_stats(40)
eng.close()
