"""A/B in one process, alternated: queries and keys rotated by the C pass (workers/rotary.py) against apply_rope's
torch ops, for full, reuse and blend at 0.15 / 0.3 / 0.5 over the engine's own stored chunks, 3 bench prompts, on
the scheduler's thread. Prints each mode's median and blend's speedup over full within each variant. argv: rounds."""
import os, statistics, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts, mode_plans, prefill_on_thread
import workers.rotary as rotary

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
eng, layouts = engine_and_prompts()
fits = rotary.rows_fit
variants = {"torch": lambda *a: False, "C": fits}
plans = mode_plans()
times = {(v, m): [] for v in variants for m in plans}
names = list(variants)
for i in range(ROUNDS):
    for v in names[i % 2:] + names[:i % 2]:
        rotary.rows_fit = variants[v]
        for m, plan in plans.items():
            times[v, m].append(sum(prefill_on_thread(eng, layout, plan)[0] for layout in layouts) / len(layouts))
rotary.rows_fit = fits
med = {k: statistics.median(x) for k, x in times.items()}
for m in plans:
    a, b = med["torch", m], med["C", m]
    line = f"{str(m):5s} torch {a * 1e3:7.1f} ms  C {b * 1e3:7.1f} ms  ({a / b:.3f}x)"
    if m not in ("full", "reuse"):
        line += f"   vs full: torch {med['torch', 'full'] / a:.2f}x  C {med['C', 'full'] / b:.2f}x"
    print(line)
eng.close()
