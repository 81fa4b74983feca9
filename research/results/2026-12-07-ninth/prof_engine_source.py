"""Where blend's time goes over the chunks the engine stores (wk4v3, `doc` form, context drift): torch profiler
around run_prefill on the scheduler's thread, the bench's first prompt. argv: ratio (0.15)."""
import sys, tempfile, time, statistics, torch
from workers.allocator import retain_freed_memory
from ragkv.bench.rag_dataset import make_queries
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.prompt import build_prompt
from workers.requests import GenerateRequest

ratio = float(sys.argv[1]) if len(sys.argv) > 1 else 0.15
retain_freed_memory()
eng = Engine(EngineConfig(store=f"disk:{tempfile.mkdtemp()}", sequence_cache=False))
r = eng.runner
q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=0)[0]
eng.generate(GenerateRequest(question=q.question, chunks=q.chunks, mode="reuse", max_new_tokens=1))
layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
plans = {"full": plan_for("full", BlendConfig()), "blend": plan_for("blend", BlendConfig(recompute_ratio=ratio))}


def one(plan):
    source = eng.chunks.for_request("", [None] * 8, lambda: False)
    t = time.perf_counter(); out = run_prefill(r, layout, plan, source, eng.config.chunk_form)
    return time.perf_counter() - t, out.stats.breakdown


times = {k: [] for k in plans}
for _ in range(3):
    for k, plan in plans.items():
        times[k].append(eng.scheduler.call(lambda: one(plan))[0])
print("tokens", layout.num_tokens, {k: round(statistics.median(v), 3) for k, v in times.items()},
      "speedup", round(statistics.median(times["full"]) / statistics.median(times["blend"]), 2))


def profiled():
    with torch.profiler.profile(record_shapes=True) as p:
        one(plans["blend"])
    return p


p = eng.scheduler.call(profiled)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=40,
                                                      max_name_column_width=40, max_shapes_column_width=90))
eng.close()
