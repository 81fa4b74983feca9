"""blend@0.15 at ~2,150 tokens (the bench's first prompt, 256-token chunks), direct, one pool: the query-block
row count of workers/attention.py (64) against 32 and 16, alternated in one process, median of 5 each."""
import statistics, sys, time
import workers.attention as attention
from bench_prompt import bench_prompt
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill

chunk_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 256
r, layout, held = bench_prompt(chunk_tokens)
plan = plan_for("blend", BlendConfig(recompute_ratio=0.15))
original = attention.query_blocks
times = {rows: [] for rows in (64, 32, 16)}
run_prefill(r, layout, plan, held)
for _ in range(3):
    for rows in times:
        attention.query_blocks = lambda q, k, rows=rows, window=None: original(q, k, rows=rows, window=window)
        for _ in range(5):
            t = time.perf_counter(); run_prefill(r, layout, plan, held); times[rows].append(time.perf_counter() - t)
attention.query_blocks = original
print("tokens", layout.num_tokens, {rows: round(statistics.median(v) * 1e3) for rows, v in times.items()}, "ms")
