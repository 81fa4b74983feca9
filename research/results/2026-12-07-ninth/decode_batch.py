"""A decode step's time against its batch size (avx2 kernel, ~1,116-token caches, bf16 prefill kernel), on one
thread that owns the only OpenMP pool, with the parts: layers vs lm_head."""
import sys
from pathlib import Path
import copy, time, statistics, torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-eighth"))  # the eighth session's prompt helper
from bench_prompt import bench_prompt  # noqa: E402
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.batching.step import decode_step

r, layout, held = bench_prompt(128)
w = r.decode_weights("avx2", 16)
print("native", w.native is not None, w.kernel)
base = run_prefill(r, layout, plan_for("full", BlendConfig()), held).cache
n = layout.num_tokens

def med(fn, k=15):
    ts = []
    for _ in range(k):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3

with torch.inference_mode():
    for B in (1, 2, 4, 8, 16):
        caches = [copy.deepcopy(base) for _ in range(B)]
        step = [0]
        def one():
            decode_step(r, w, [100] * B, [n + step[0]] * B, caches); step[0] += 1
        t = med(one)
        lm = med(lambda: w.lm_head(w.final_norm(torch.randn(B, r.shape.hidden_size))))
        print(f"B={B:2d}: step {t:6.2f} ms ({t / B:5.2f} ms a token), lm_head {lm:5.2f} ms")
