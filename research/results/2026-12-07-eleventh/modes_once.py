"""Full, reuse and blend@0.15/0.3/0.5 prefills over the engine's own stored chunks (3 bench prompts), on the
scheduler's thread, N rounds; prints each mode's median and blend's speedup over full. Run once per environment
(e.g. OpenMP's wait policy) to compare processes: omp_env.sh alternates them. argv: rounds (3), label."""
import os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts, mode_plans, prefill_on_thread

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
LABEL = sys.argv[2] if len(sys.argv) > 2 else "default"
eng, layouts = engine_and_prompts()
plans = mode_plans()


times = {m: [] for m in plans}
for _ in range(ROUNDS):
    for m, plan in plans.items():
        times[m].append(sum(prefill_on_thread(eng, layout, plan)[0] for layout in layouts) / len(layouts))
med = {m: statistics.median(x) for m, x in times.items()}
print(LABEL, " ".join(f"{m}={med[m] * 1e3:.1f}ms" for m in plans),
      " ".join(f"x{m}={med['full'] / med[m]:.2f}" for m in plans if m not in ("full",)))
eng.close()
