"""argv: held | store. Is the engine's blend slower than the same pipeline called directly? One process, one engine (disk store,
default codec, bf16), the blend bench's first query: alternately (A) engine.generate at gradual@0.15 (its
stats' breakdown) and (B) run_prefill over the engine's own layout with chunks held in memory, on the
scheduler's thread (engine.scheduler.call), timed inside."""
import statistics, sys, tempfile, time
from workers.allocator import retain_freed_memory
from ragkv.bench.rag_dataset import make_queries
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.prompt import build_prompt
from workers.requests import GenerateRequest

retain_freed_memory()
tmp = tempfile.mkdtemp()
eng = Engine(EngineConfig(store=f"disk:{tmp}", sequence_cache=False))
r = eng.runner
q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=0)[0]
setting = BlendConfig(recompute_ratio=0.15)
eng.blend_setting = (setting, "ab")
req = GenerateRequest(question=q.question, chunks=q.chunks, mode="blend", max_new_tokens=1)
eng.generate(req)
res = eng.generate(req)
layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
print("engine prompt tokens", res.stats.get("prompt_tokens") if isinstance(res.stats, dict) else None, "direct", layout.num_tokens)
held = eng.scheduler.call(lambda: HeldChunks(r.chunk_kv(layout.prefix_ids), [r.chunk_kv(r.tokenize(c)).with_rope(True) for c in q.chunks]))
plan = plan_for("blend", setting)

SOURCE = sys.argv[1] if len(sys.argv) > 1 else "held"  # held: KV in memory; store: the engine's own source


def direct():
    source = held if SOURCE == "held" else eng.chunks.for_request("", [None] * len(q.chunks), lambda: False)
    t = time.perf_counter(); out = run_prefill(r, layout, plan, source, eng.config.chunk_form)
    return time.perf_counter() - t, out.stats
A, B, AL, BL = [], [], [], []
for i in range(8):
    res = eng.generate(req)
    st = res.stats
    bd = st["breakdown"] if isinstance(st, dict) else st.breakdown
    A.append(sum(v for k, v in bd.items() if k != "queue")); AL.append(bd["layers"])
    t, s = eng.scheduler.call(direct)
    B.append(t); BL.append(s.breakdown["layers"])
med = lambda v: round(statistics.median(v) * 1e3, 1)
print(f"engine prefill {med(A)} ms (layers {med(AL)}); direct on the scheduler thread {med(B)} ms (layers {med(BL)})")
eng.close()
