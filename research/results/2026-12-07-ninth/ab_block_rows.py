"""A/B in one process, alternated, now that blocks and masks are planned once per pass: query blocks of 64 rows
(the default) against 32 and 48. The blend bench's first prompt, held KV, bf16. argv: chunk_tokens rounds."""
from pathlib import Path
import statistics, sys, time, torch
import workers.attention as attention
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-eighth"))  # the eighth session's prompt helper
from bench_prompt import bench_prompt  # noqa: E402
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill

original = attention.query_blocks
chunk_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 128
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
r, layout, held = bench_prompt(chunk_tokens)
plans = {"0.15": plan_for("blend", BlendConfig(recompute_ratio=0.15)), "0.3": plan_for("blend", BlendConfig(recompute_ratio=0.3)),
         "0.5": plan_for("blend", BlendConfig(recompute_ratio=0.5))}
sizes = (64, 32, 48)
t = {(w, k): [] for w in sizes for k in plans}
with torch.inference_mode():
    for i in range(ROUNDS):
        for rows in sizes[i % 3:] + sizes[:i % 3]:
            attention.query_blocks = lambda q, kv, rows_=rows, window=None: original(q, kv, rows=rows_, window=window)
            for k, plan in plans.items():
                s = time.perf_counter(); run_prefill(r, layout, plan, held); t[rows, k].append(time.perf_counter() - s)
print("tokens", layout.num_tokens)
for k in plans:
    print(k, "  ".join(f"{rows} rows {statistics.median(t[rows, k]) * 1e3:6.1f} ms" for rows in sizes))
