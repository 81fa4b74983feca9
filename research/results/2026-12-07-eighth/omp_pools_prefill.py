"""Blend@0.15 / full / reuse prefills on the main thread, before and after a second thread has run an OpenMP
parallel region (and stays alive): the two-pool slowdown workers/openmp.py removes. One process, side by side."""
import time, sys, statistics, threading, torch
sys.path.insert(0, "/work/main/research/results/2026-12-07-seventh")
from workers.allocator import retain_freed_memory
retain_freed_memory()
from prompt import blend_prompt
from workers.pipeline import run_prefill
from workers.modes import plan_for
from workers.blend import BlendConfig
r, layout, held = blend_prompt(pre_rope=True)
r = r.with_kernel("bf16")
plans = {"full": plan_for("full", BlendConfig()), "reuse": plan_for("reuse", BlendConfig()), "blend@0.15": plan_for("blend", BlendConfig(recompute_ratio=0.15))}
def measure(label):
    out = {}
    for name, plan in plans.items():
        run_prefill(r, layout, plan, held); ts = []
        for _ in range(5):
            t = time.perf_counter(); run_prefill(r, layout, plan, held); ts.append(time.perf_counter() - t)
        out[name] = round(statistics.median(ts) * 1e3)
    print(label, out, flush=True)
measure("one thread uses OpenMP")
a = torch.randn(500, 500); ev = threading.Event()
t = threading.Thread(target=lambda: ([a @ a for _ in range(3)], ev.wait())); t.start(); time.sleep(0.3)
measure("a second thread has used OpenMP")
ev.set(); t.join()
