"""A/B in one process, alternated: blend's recompute planning attention at every layer (before) against one
plan shared by the layers of a pass (after, attention.PlanMemo). The blend bench's first prompt, held KV, bf16."""
from pathlib import Path
import statistics, sys, time, torch
import workers.blend as blend
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-eighth"))  # the eighth session's prompt helper
from bench_prompt import bench_prompt  # noqa: E402
from workers.attention import PlanMemo, plan_attention
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill


class EveryLayer(PlanMemo):
    def plan(self, *args):
        return plan_attention(*args)


chunk_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 128
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 9
r, layout, held = bench_prompt(chunk_tokens)
plans = {"0.15": plan_for("blend", BlendConfig(recompute_ratio=0.15)), "0.5": plan_for("blend", BlendConfig(recompute_ratio=0.5)),
         "reuse": plan_for("reuse", BlendConfig())}
t = {(w, k): [] for w in ("before", "after") for k in plans}
with torch.inference_mode():
    for i in range(ROUNDS):
        for w, memo in (("before", EveryLayer), ("after", PlanMemo)) if i % 2 == 0 else (("after", PlanMemo), ("before", EveryLayer)):
            blend.PlanMemo = memo
            for k, plan in plans.items():
                s = time.perf_counter(); run_prefill(r, layout, plan, held); t[w, k].append(time.perf_counter() - s)
print("tokens", layout.num_tokens)
for k in plans:
    b, a = statistics.median(t["before", k]), statistics.median(t["after", k])
    print(f"{k:6s} before {b * 1e3:7.1f} ms  after {a * 1e3:7.1f} ms  ({b / a:.3f}x)")
