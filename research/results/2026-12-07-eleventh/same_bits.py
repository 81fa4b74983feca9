"""Does the one-pass placement change what a request computes? Reuse, shift and blend at 0.15 / 0.5 over the
engine's own stored chunks (3 bench prompts), each once with the C pass and once with the torch ops: the fused
cache and the logits compared bit for bit."""
import os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts
import workers.placement as placement
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill

eng, layouts = engine_and_prompts()
native = placement.runs_native
plans = {"reuse": plan_for("reuse", BlendConfig()), **{x: plan_for("blend", BlendConfig(recompute_ratio=x)) for x in (0.15, 0.5)}}


def run(layout, plan, use):
    def one():
        placement.runs_native = use
        try:
            source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
            out = run_prefill(eng.runner, layout, plan, source, eng.config.chunk_form)
            return out.logits, [(kv.keys.clone(), kv.values.clone()) for kv in out.cache.layers]
        finally:
            placement.runs_native = native
    return eng.scheduler.call(one)


for i, layout in enumerate(layouts):
    for name, plan in plans.items():
        (la, ca), (lb, cb) = run(layout, plan, native), run(layout, plan, lambda *a: False)
        same_cache = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ca, cb))
        print(f"prompt {i} {name}: logits equal {torch.equal(la, lb)}, cache equal {same_cache}, "
              f"max |logit diff| {(la - lb).abs().max().item():.2e}")
eng.close()
