"""argv: rounds [comma-separated variants]. A/B in one process, alternated: how blend's recomputed rows are cut into query blocks. The engine's own chunk
source (stored wk4v3 `doc`-form chunks, context drift), on its scheduler's thread, blend bench queries (seeds
0, 8, 9), ratios 0.15 / 0.3 / 0.5. Variants: `old` (64-row blocks, only when they save a quarter of one call's
key-rows: the code before this change), `64` (always when they save), `dp C` (attention.query_blocks: cuts at
16-row multiples chosen by dynamic programming, C key-rows a call). argv: rounds."""
import statistics, subprocess, sys
import workers.attention as attention
from engine_prompts import alternate, engine_and_prompts

old_source = subprocess.run(["git", "show", "e29804b:workers/attention.py"], capture_output=True, text=True).stdout
old_ns = {}
exec(compile(old_source, "old_attention", "exec"), old_ns)
dp = attention.query_blocks
VARIANTS = {
    "old": lambda q, kv, window=None: old_ns["query_blocks"](q, kv, window=window),
    "64": lambda q, kv, window=None: dp(q, kv, window=window, grain=64, call_cost=0),
    "dp 800": lambda q, kv, window=None: dp(q, kv, window=window, call_cost=800),
    "dp 1500": lambda q, kv, window=None: dp(q, kv, window=window, call_cost=1500),
    "dp 3000": lambda q, kv, window=None: dp(q, kv, window=window, call_cost=3000),
    "dp 6000": lambda q, kv, window=None: dp(q, kv, window=window, call_cost=6000),
    "dp32 3000": lambda q, kv, window=None: dp(q, kv, window=window, grain=32, call_cost=3000),
}
variants = {k: VARIANTS[k] for k in (sys.argv[2].split(",") if len(sys.argv) > 2 else VARIANTS)}
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
eng, prompts = engine_and_prompts()
r = eng.runner
ratios = (0.15, 0.3, 0.5)
names = list(variants)
t = alternate(eng, prompts, names, lambda v: setattr(attention, "query_blocks", variants[v]), ratios, ROUNDS)
attention.query_blocks = dp
print("prompts", [p.num_tokens for p in prompts])
for x in ratios:
    base = statistics.median(t["old", x])
    print(f"{x}: " + "  ".join(f"{v} {statistics.median(t[v, x]) * 1e3:6.1f} ms ({base / statistics.median(t[v, x]):.3f}x)" for v in names))
eng.close()
