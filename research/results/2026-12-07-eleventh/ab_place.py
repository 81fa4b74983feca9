"""A/B in one process, alternated: a stored chunk placed by the one C pass (workers/placement.c: drift, rotation,
copy) against the torch ops it replaces (the tenth session's path: a shifted copy, a rotated copy, the write), for
full, reuse and blend at 0.15 / 0.3 / 0.5 over the engine's own stored chunks, 3 bench prompts, on the
scheduler's thread. Prints each mode's median and blend's speedup over full within each variant. argv: rounds (5)."""
import os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts, mode_plans, prefill_on_thread
import workers.placement as placement

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
eng, layouts = engine_and_prompts()
native = placement.runs_native
variants = {"torch": lambda *a: False, "one pass": native}
plans = mode_plans()


times = {(v, m): [] for v in variants for m in plans}
stages = {(v, m): [] for v in variants for m in plans}
names = list(variants)
for i in range(ROUNDS):
    for v in names[i % 2:] + names[:i % 2]:
        placement.runs_native = variants[v]
        for m, plan in plans.items():
            runs = [prefill_on_thread(eng, layout, plan) for layout in layouts]
            times[v, m].append(sum(t for t, _ in runs) / len(runs))
            stages[v, m].append(sum(o.stats.breakdown.get("shift", 0) + o.stats.breakdown.get("fuse", 0)
                                    for _, o in runs) / len(runs))
placement.runs_native = native
med = {k: statistics.median(x) for k, x in times.items()}
mst = {k: statistics.median(x) for k, x in stages.items()}
for m in plans:
    a, b = med["torch", m], med["one pass", m]
    line = (f"{str(m):5s} torch {a * 1e3:7.1f} ms  one pass {b * 1e3:7.1f} ms  ({a / b:.3f}x)"
            f"  shift+fuse {mst['torch', m] * 1e3:5.1f} / {mst['one pass', m] * 1e3:5.1f} ms")
    if m not in ("full", "reuse"):
        line += f"   vs full: torch {med['torch', 'full'] / a:.2f}x  one pass {med['one pass', 'full'] / b:.2f}x"
    print(line)
eng.close()
