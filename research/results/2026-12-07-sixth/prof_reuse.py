import time, torch, statistics
from workers.runner import ModelRunner
from workers.prompt import build_prompt
from workers.pipeline import run_prefill, HeldChunks
from workers.modes import plan_for
from workers.blend import BlendConfig
r = ModelRunner.load("default")
text = "The lighthouse keeper counted ships every evening in a green ledger and wrote the weather beside each. "
chunks = [r.tokenize((f"Document {i}. " + text * 12))[:128] for i in range(8)]
layout = build_prompt(r.tokenizer, "", chunks, "What did the keeper count in the ledger, and where?")
prefix = r.chunk_kv(layout.prefix_ids); kvs = [r.chunk_kv(c) for c in chunks]
held = HeldChunks(prefix, kvs)
print("tokens", layout.num_tokens)
for name, cfg in (("reuse", None), ("0.15", BlendConfig(recompute_ratio=0.15))):
    plan = plan_for("reuse", BlendConfig()) if cfg is None else plan_for("blend", cfg)
    ts = []
    for _ in range(3):
        t = time.perf_counter(); out = run_prefill(r, layout, plan, held); ts.append(time.perf_counter() - t)
    print(name, [round(x, 3) for x in ts], {k: round(v, 3) for k, v in out.stats.breakdown.items()})
plan = plan_for("reuse", BlendConfig())
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
    run_prefill(r, layout, plan, held)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
