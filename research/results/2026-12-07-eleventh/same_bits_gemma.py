"""same_bits.py for Gemma 3 270M (per-layer RoPE bases, heads of 256): reuse and blend@0.15 over the engine's own
stored chunks, 2 bench prompts, each with the one-pass placement and with the torch ops: cache and logits compared
bit for bit."""
import tempfile
import torch
import workers.placement as placement
from ragkv.bench.rag_dataset import make_queries
from workers.allocator import retain_freed_memory
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.prompt import build_prompt
from workers.requests import GenerateRequest

retain_freed_memory()
eng = Engine(EngineConfig(model="gemma3-270m", store=f"disk:{tempfile.mkdtemp()}", sequence_cache=False))
r, native = eng.runner, placement.runs_native
took = []  # what runs_native answered for the C side's chunks: the pass must have run for the comparison to mean anything


def counted(*args):
    took.append(native(*args))
    return took[-1]
plans = {"reuse": plan_for("reuse", BlendConfig()), "0.15": plan_for("blend", BlendConfig(recompute_ratio=0.15))}
for seed in (0, 8):
    q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=seed)[0]
    eng.generate(GenerateRequest(question=q.question, chunks=q.chunks, mode="reuse", max_new_tokens=1))
    layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
    for name, plan in plans.items():
        def run(use):
            def one():
                placement.runs_native = use
                try:
                    source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
                    out = run_prefill(r, layout, plan, source, eng.config.chunk_form)
                    return out.logits, [(kv.keys.clone(), kv.values.clone()) for kv in out.cache.layers]
                finally:
                    placement.runs_native = native
            return eng.scheduler.call(one)
        took.clear()
        (la, ca), (lb, cb) = run(counted), run(lambda *a: False)
        same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ca, cb))
        print(f"gemma seed {seed} {name}: C pass for {sum(took)} of {len(took)} chunks; logits equal "
              f"{torch.equal(la, lb)}, cache equal {same}")
eng.close()
