"""Full, reuse and blend@0.15/0.3/0.5 prefills over the engine's own stored chunks (3 bench prompts), on the
scheduler's thread, N rounds; prints each mode's median and blend's speedup over full. Run once per environment
(e.g. OpenMP's wait policy) to compare processes: omp_env.sh alternates them. argv: rounds (3), label."""
import os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
LABEL = sys.argv[2] if len(sys.argv) > 2 else "default"
eng, layouts = engine_and_prompts()
plans = {"full": plan_for("full", BlendConfig()), "reuse": plan_for("reuse", BlendConfig())}
plans.update({x: plan_for("blend", BlendConfig(recompute_ratio=x)) for x in (0.15, 0.3, 0.5)})


def timed(layout, plan):
    def one():
        source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
        start = time.perf_counter()
        run_prefill(eng.runner, layout, plan, source, eng.config.chunk_form)
        return time.perf_counter() - start
    return eng.scheduler.call(one)


times = {m: [] for m in plans}
for _ in range(ROUNDS):
    for m, plan in plans.items():
        times[m].append(sum(timed(layout, plan) for layout in layouts) / len(layouts))
med = {m: statistics.median(x) for m, x in times.items()}
print(LABEL, " ".join(f"{m}={med[m] * 1e3:.1f}ms" for m in plans),
      " ".join(f"x{m}={med['full'] / med[m]:.2f}" for m in plans if m not in ("full",)))
eng.close()
