"""How much of each mode's prefill is the row-attention kernel (its C call timed inside the prefill), full,
reuse and blend@0.15/0.3/0.5 over the engine's stored chunks (the bench's prompts), on the scheduler's thread."""
import os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts, mode_plans, prefill_on_thread
from workers import row_attention

eng, layouts = engine_and_prompts()
plans = mode_plans()
spent = [0.0]
original = row_attention.attend_rows


def timed(*a, **k):
    t = time.perf_counter()
    out = original(*a, **k)
    spent[0] += time.perf_counter() - t
    return out


row_attention.attend_rows = timed
rows = {m: [] for m in plans}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for m, plan in plans.items():
        for layout in layouts:
            spent[0] = 0.0
            total = prefill_on_thread(eng, layout, plan)[0]
            rows[m].append((total, spent[0]))
for m, xs in rows.items():
    total = statistics.median(x[0] for x in xs); att = statistics.median(x[1] for x in xs)
    print(f"{m:>5}: {total * 1e3:7.1f} ms, attention {att * 1e3:6.1f} ms ({att / total:.0%})")
eng.close()
