"""fp32 against bf16 row attention through the engine: full, reuse and blend@0.15/0.3/0.5 over the engine's stored
chunks (the bench's 3 prompts), on the scheduler's thread, the two alternated per round (the order swapped every
round). argv: rounds (5)."""
import os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts, mode_plans, prefill_on_thread
from workers.projections import Bf16Projections

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
eng, layouts = engine_and_prompts()
assert eng.runner.projections.__class__ is Bf16Projections, "run on a bf16 box"
plans = mode_plans()
times = {(v, m): [] for v in (False, True) for m in plans}
for i in range(ROUNDS):
    for v in ((False, True) if i % 2 == 0 else (True, False)):
        Bf16Projections.attention_bf16 = v
        for m, plan in plans.items():
            times[v, m].append(sum(prefill_on_thread(eng, layout, plan)[0] for layout in layouts) / len(layouts))
med = {k: statistics.median(x) for k, x in times.items()}
for m in plans:
    a, b = med[False, m], med[True, m]
    print(f"{m:>5}: fp32 attention {a * 1e3:7.1f} ms  bf16 attention {b * 1e3:7.1f} ms  ({a / b:.3f}x)")
for v in (False, True):
    print(f"over full, {'bf16' if v else 'fp32'} attention:",
          " ".join(f"{m}={med[v, 'full'] / med[v, m]:.2f}x" for m in plans if m != "full"))
eng.close()
