"""A/B in one process, alternated: attention by the row kernel (workers/row_attention.c) against SDPA's plans (the
ninth session's path), for full, reuse and blend at 0.15 / 0.3 / 0.5 over the engine's own stored chunks, 3 bench
prompts, on the scheduler's thread. Prints each mode's median over the rounds and blend's speedup over full
within each variant. argv: rounds (5)."""
import statistics, sys, time
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts
import workers.row_attention as row_attention
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
eng, layouts = engine_and_prompts()
usable = row_attention.usable
variants = {"sdpa": lambda *a: False, "rows": usable}
plans = {"full": plan_for("full", BlendConfig()), "reuse": plan_for("reuse", BlendConfig())}
plans.update({x: plan_for("blend", BlendConfig(recompute_ratio=x)) for x in (0.15, 0.3, 0.5)})


def timed(layout, plan):
    def one():
        source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
        start = time.perf_counter()
        run_prefill(eng.runner, layout, plan, source, eng.config.chunk_form)
        return time.perf_counter() - start
    return eng.scheduler.call(one)


times = {(v, m): [] for v in variants for m in plans}
names = list(variants)
for i in range(ROUNDS):
    for v in names[i % 2:] + names[:i % 2]:
        row_attention.usable = variants[v]
        for m, plan in plans.items():
            times[v, m].append(sum(timed(layout, plan) for layout in layouts) / len(layouts))
row_attention.usable = usable
med = {k: statistics.median(x) for k, x in times.items()}
for m in plans:
    s, r = med["sdpa", m], med["rows", m]
    line = f"{str(m):5s} sdpa {s * 1e3:7.1f} ms  rows {r * 1e3:7.1f} ms  ({s / r:.3f}x)"
    if m not in ("full", "reuse"):
        line += f"   vs full: sdpa {med['sdpa', 'full'] / s:.2f}x  rows {med['rows', 'full'] / r:.2f}x"
    print(line)
eng.close()
