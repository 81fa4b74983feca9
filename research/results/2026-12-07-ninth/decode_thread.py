"""Scheduler.run's docstring says a decode step runs about twice as fast on the main thread as on a second one.
With one OpenMP pool (the other thread's released, workers/openmp.py), time batch-1 decode steps (avx2 kernel,
~1,116-token cache) on the main thread, then on a second thread, then on the main thread again."""
import copy, statistics, sys, threading, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-eighth"))  # the eighth session's prompt helper
from bench_prompt import bench_prompt  # noqa: E402
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.openmp import release_pool
from workers.pipeline import run_prefill
from workers.batching.step import decode_step

r, layout, held = bench_prompt(128)
w = r.decode_weights("avx2", 16)
base = run_prefill(r, layout, plan_for("full", BlendConfig()), held).cache
n = layout.num_tokens


def steps(label, out, count=60):
    cache = copy.deepcopy(base)
    ts = []
    with torch.inference_mode():
        for s in range(count):
            t = time.perf_counter(); decode_step(r, w, [100], [n + s], [cache]); ts.append(time.perf_counter() - t)
    out[label] = statistics.median(ts[5:]) * 1e3


out = {}
for round_ in range(2):
    steps(f"main {round_}", out)
    release_pool()
    th = threading.Thread(target=steps, args=(f"second thread {round_}", out))
    th.start(); th.join()
for k, v in out.items():
    print(f"{k}: {v:.2f} ms a step")
