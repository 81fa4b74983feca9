import sys
from pathlib import Path
import copy, time, torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-eighth"))  # the eighth session's prompt helper
from bench_prompt import bench_prompt  # noqa: E402
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.batching.step import decode_step
r, layout, held = bench_prompt(128)
w = r.decode_weights("avx2", 16)
base = run_prefill(r, layout, plan_for("full", BlendConfig()), held).cache
n, B = layout.num_tokens, 8
caches = [copy.deepcopy(base) for _ in range(B)]
with torch.inference_mode():
    t = time.perf_counter()
    for s in range(1500):
        decode_step(r, w, [100] * B, [n + s] * B, caches)
    print("step ms", (time.perf_counter() - t) / 1500 * 1e3)
