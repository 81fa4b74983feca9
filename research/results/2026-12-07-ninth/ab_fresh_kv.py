"""A/B in one process, alternated: blend's choice of tokens computing fresh q/k/v of every candidate and dropping q
(before) against k/v alone (runner.kv, after). The engine's own chunk source, 3 bench prompts, on its thread."""
import statistics, sys, tempfile, time
from workers.allocator import retain_freed_memory
from ragkv.bench.rag_dataset import make_queries
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.prompt import build_prompt
from workers.requests import GenerateRequest

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
retain_freed_memory()
eng = Engine(EngineConfig(store=f"disk:{tempfile.mkdtemp()}", sequence_cache=False))
r = eng.runner
runner_type, kv_alone = type(r), type(r).kv
with_q = lambda self, layer, normed, positions: self.qkv(layer, normed, positions)[1:]  # noqa: E731
layouts = []
for seed in (0, 8, 9):
    q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=seed)[0]
    eng.generate(GenerateRequest(question=q.question, chunks=q.chunks, mode="reuse", max_new_tokens=1))
    layouts.append(build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question))
ratios = (0.15, 0.3, 0.5)
t = {(w, x): [] for w in ("before", "after") for x in ratios}


def one(layout, ratio):
    source = eng.chunks.for_request("", [None] * 8, lambda: False)
    s = time.perf_counter()
    run_prefill(r, layout, plan_for("blend", BlendConfig(recompute_ratio=ratio)), source, eng.config.chunk_form)
    return time.perf_counter() - s


for i in range(ROUNDS):
    for w, fn in (("before", with_q), ("after", kv_alone)) if i % 2 == 0 else (("after", kv_alone), ("before", with_q)):
        runner_type.kv = fn
        for x in ratios:
            t[w, x].append(sum(eng.scheduler.call(lambda: one(layout, x)) for layout in layouts) / len(layouts))
runner_type.kv = kv_alone
for x in ratios:
    b, a = statistics.median(t["before", x]), statistics.median(t["after", x])
    print(f"{x}: before {b * 1e3:6.1f} ms  after {a * 1e3:6.1f} ms  ({b / a:.3f}x)")
eng.close()
