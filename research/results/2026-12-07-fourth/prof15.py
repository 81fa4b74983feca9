"""Profile run_prefill for blend@0.15 / reuse / full on the engine's own path (8 x 128-token chunks)."""
import sys, time, tempfile, statistics
import torch
from workers.engine import Engine, EngineConfig
from workers.requests import GenerateRequest
from workers.pipeline import run_prefill
from workers.modes import plan_for
from workers.blend import BlendConfig
from workers.prompt import build_prompt
from ragkv.bench.rag_dataset import make_queries

torch.set_num_threads(2)
tmp = tempfile.mkdtemp()
eng = Engine(EngineConfig(store=f"disk:{tmp}/b"))
r = eng.runner
qs = make_queries(4, 8, 128, lambda t: len(r.tokenize(t)), seed=3)
for q in qs:
    eng.ingest(q.chunks)
def one(q, mode, ratio):
    layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
    src = eng.chunks.for_request("", [None] * len(q.chunks), lambda: False)
    cfg = BlendConfig() if ratio is None else BlendConfig(recompute_ratio=ratio)
    t = time.perf_counter(); out = run_prefill(r, layout, plan_for(mode, cfg), src); dt = time.perf_counter() - t
    return dt, out.stats
print("kernel", r.kernel, "tokens", build_prompt(r.tokenizer, "", [r.tokenize(c) for c in qs[0].chunks], qs[0].question).num_tokens)
for q in qs[:1]:
    for m, ra in (("full", None), ("reuse", None), ("blend", 0.15)):
        one(q, m, ra)
res = {}
for rep in range(3):
    for q in qs:
        for m, ra in (("full", None), ("reuse", None), ("blend", 0.15), ("blend", 0.3)):
            dt, st = one(q, m, ra)
            res.setdefault((m, ra), []).append((dt, st))
for k, v in res.items():
    med = statistics.median(d for d, _ in v)
    bd = {s: round(statistics.median(st.breakdown.get(s, 0) for _, st in v), 4) for s in ("load", "fuse", "shift", "layers", "logits")}
    print(k, round(med, 4), "cf", round(v[0][1].compute_fraction, 3), bd)
if "--profile" in sys.argv:
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for q in qs:
            one(q, "blend", 0.15)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    import cProfile, pstats
    pr = cProfile.Profile(); pr.enable()
    for q in qs: one(q, "blend", 0.15)
    pr.disable(); pstats.Stats(pr).sort_stats("cumulative").print_stats(35)
eng.close()
