"""Blend@0.15's time by layer over the engine's stored chunks (bench prompt seeds 0, 8, 9), on the scheduler's
thread, against full's: layers 0-1 (every token), 2-4 (gradual's checks: probe + narrowing), 5-29 (the budget's
rows), and the selection's own work (keep), median of 5 runs each."""
import statistics, tempfile, time, torch
from workers.allocator import retain_freed_memory
from ragkv.bench.rag_dataset import make_queries
import workers.blend as blend
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.prompt import build_prompt
from workers.requests import GenerateRequest

retain_freed_memory()
eng = Engine(EngineConfig(store=f"disk:{tempfile.mkdtemp()}", sequence_cache=False))
r = eng.runner
acc = {}
original_forward, original_make = type(r).layer_forward, blend.make_selection


def timed_forward(self, layer, *args, **kwargs):
    t = time.perf_counter(); out = original_forward(self, layer, *args, **kwargs)
    acc.setdefault(("layer", layer), 0.0); acc[("layer", layer)] += time.perf_counter() - t
    return out


class TimedSelection:
    def __init__(self, inner): self.inner = inner
    def __getattr__(self, name): return getattr(self.inner, name)
    def keep(self, layer, *args):
        t = time.perf_counter(); out = self.inner.keep(layer, *args)
        acc.setdefault(("keep", layer), 0.0); acc[("keep", layer)] += time.perf_counter() - t
        return out


type(r).layer_forward = timed_forward
blend.make_selection = lambda config: TimedSelection(original_make(config))
layouts = []
for seed in (0, 8, 9):
    q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=seed)[0]
    eng.generate(GenerateRequest(question=q.question, chunks=q.chunks, mode="reuse", max_new_tokens=1))
    layouts.append(build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question))
groups = {"0-1": range(0, 2), "2-4": range(2, 5), "5-29": range(5, 30)}
res = {}
for mode, plan in (("full", plan_for("full", BlendConfig())), ("blend@0.15", plan_for("blend", BlendConfig(recompute_ratio=0.15)))):
    rows = []
    for _ in range(5):
        acc.clear()
        total = 0.0
        for layout in layouts:
            source = eng.chunks.for_request("", [None] * 8, lambda: False)
            t = time.perf_counter()
            out = eng.scheduler.call(lambda: run_prefill(r, layout, plan, source, eng.config.chunk_form))
            total += time.perf_counter() - t
            for stage, v in out.stats.breakdown.items():
                acc.setdefault(("stage", stage), 0.0); acc[("stage", stage)] += v
        row = {g: sum(acc.get(("layer", l), 0) for l in ls) / len(layouts) for g, ls in groups.items()}
        row["keep"] = sum(v for (k, _), v in acc.items() if k == "keep") / len(layouts)
        row["total"] = total / len(layouts)
        row.update({f"stage {k}": v / len(layouts) for (kind, k), v in acc.items() if kind == "stage"})
        rows.append(row)
    res[mode] = {k: statistics.median(r_[k] for r_ in rows) for k in rows[0]}
for mode, row in res.items():
    print(mode, {k: round(v * 1e3, 1) for k, v in row.items()})
f = res["full"]
print("blend / full by group:", {k: round(res["blend@0.15"][k] / f[k], 3) for k in ("0-1", "2-4", "5-29", "total") if f[k]})
eng.close()
