"""A/B in one process, alternated: the bf16 kernel with plain weights through F.linear and the model's fp32 LM
head (before) against oneDNN-packed weights and a bf16 LM head (after). The blend bench's first prompt,
held KV; TTFT of each mode, median of ROUNDS."""
from pathlib import Path
import copy, statistics, sys, time, torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-eighth"))  # the eighth session's prompt helper
from bench_prompt import bench_prompt  # noqa: E402
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.projections import Bf16Matrix

chunk_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 128
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
new, layout, held = bench_prompt(chunk_tokens)
old = copy.copy(new)
old.projections = copy.copy(new.projections)
old.projections.layers = [copy.copy(l) for l in new.projections.layers]
# rebuild the plain weights the way the code did before this change
def cat(*ws):
    return torch.cat([w.weight.detach() for w in ws]).to(torch.bfloat16).contiguous()
for l, blk in zip(old.projections.layers, new.layers):
    a, m = blk.self_attn, blk.mlp
    l.qkv, l.o = Bf16Matrix(cat(a.q_proj, a.k_proj, a.v_proj), False), Bf16Matrix(cat(a.o_proj), False)
    l.gate_up, l.down = Bf16Matrix(cat(m.gate_proj, m.up_proj), False), Bf16Matrix(cat(m.down_proj), False)
old.projections.lm_head = new.model.lm_head
plans = {"full": plan_for("full", BlendConfig()), "0.15": plan_for("blend", BlendConfig(recompute_ratio=0.15)),
         "0.5": plan_for("blend", BlendConfig(recompute_ratio=0.5)), "reuse": plan_for("reuse", BlendConfig())}
t = {(w, k): [] for w in ("before", "after") for k in plans}
with torch.inference_mode():
    for i in range(ROUNDS):
        for w, r in (("before", old), ("after", new)) if i % 2 == 0 else (("after", new), ("before", old)):
            for k, plan in plans.items():
                s = time.perf_counter(); run_prefill(r, layout, plan, held); t[w, k].append(time.perf_counter() - s)
med = {key: statistics.median(v) for key, v in t.items()}
print("tokens", layout.num_tokens)
for k in plans:
    print(f"{k:6s} before {med['before', k] * 1e3:7.1f} ms  after {med['after', k] * 1e3:7.1f} ms  "
          f"({med['before', k] / med['after', k]:.3f}x)")
for w in ("before", "after"):
    print(w, "speedup vs full:", {k: round(med[w, 'full'] / med[w, k], 2) for k in plans if k != "full"})
