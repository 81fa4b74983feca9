"""Logits of full, reuse and blend@0.15 / 0.5 prefills for the 3 bench prompts over the engine's own stored chunks,
saved to argv[1] (torch.save): run in two checkouts and compare the files (same_logits.py) to show a change keeps
every bit."""
import os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-07-ninth"))
from engine_prompts import engine_and_prompts
from workers.blend import BlendConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill

eng, layouts = engine_and_prompts()
plans = {"full": plan_for("full", BlendConfig()), "reuse": plan_for("reuse", BlendConfig()),
         **{f"blend@{x}": plan_for("blend", BlendConfig(recompute_ratio=x)) for x in (0.15, 0.5)}}
out = {}
for i, layout in enumerate(layouts):
    for name, plan in plans.items():
        def one():
            source = eng.chunks.for_request("", [None] * len(layout.chunk_spans), lambda: False)
            return run_prefill(eng.runner, layout, plan, source, eng.config.chunk_form).logits.clone()
        out[f"{i}:{name}"] = eng.scheduler.call(one)
torch.save(out, sys.argv[1])
eng.close()
