"""A/B: blend with query_blocks (today) vs dense masked SDPA for scattered rows; paired per request."""
import sys, time, tempfile, statistics
import torch
import workers.attention as A
from workers.engine import Engine, EngineConfig
from workers.pipeline import run_prefill
from workers.modes import plan_for
from workers.blend import BlendConfig
from workers.prompt import build_prompt
from ragkv.bench.rag_dataset import make_queries

chunk_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 128
tmp = tempfile.mkdtemp()
eng = Engine(EngineConfig(store=f"disk:{tmp}/b"))
r = eng.runner
qs = make_queries(4, 8, chunk_tokens, lambda t: len(r.tokenize(t)), seed=5)
for q in qs:
    eng.ingest(q.chunks)
orig = A.query_blocks
def one(q, mode, ratio, blocks):
    A.query_blocks = orig if blocks else (lambda *a, **k: None)
    layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
    src = eng.chunks.for_request("", [None] * len(q.chunks), lambda: False)
    cfg = BlendConfig() if ratio is None else BlendConfig(recompute_ratio=ratio)
    t = time.perf_counter(); out = run_prefill(r, layout, plan_for(mode, cfg), src); dt = time.perf_counter() - t
    return dt, out
print("tokens", build_prompt(r.tokenizer, "", [r.tokenize(c) for c in qs[0].chunks], qs[0].question).num_tokens)
one(qs[0], "blend", 0.15, True); one(qs[0], "blend", 0.15, False)
res = {}
for rep in range(2):
    for q in qs:
        for m, ra in (("full", None), ("reuse", None), ("blend", 0.15), ("blend", 0.3), ("blend", 0.5), ("blend", 0.7)):
            for blocks in ((True, False) if m == "blend" else (True,)):
                dt, out = one(q, m, ra, blocks)
                res.setdefault((m, ra, blocks), []).append(dt)
                if m == "blend" and not blocks:
                    a = res.setdefault(("logits", ra), [])
full = statistics.median(res[("full", None, True)])
for k, v in res.items():
    if k[0] == "logits": continue
    print(k, "median", round(statistics.median(v), 4), "speedup", round(full / statistics.median(v), 2))
for ra in (0.15, 0.3, 0.5, 0.7):
    pairs = [b / a for a, b in zip(res[("blend", ra, True)], res[("blend", ra, False)])]
    print("ratio", ra, "dense/blocked paired median", round(statistics.median(pairs), 3))
eng.close()
