"""Blend@0.15 through the engine's own chunk source (stored wk4v3 `doc`-form chunks, context drift): per
recomputing layer, how many key-rows the 64-row query blocks compute against exact per-row causality, and
how many rows; held `alone`-form KV (the profile scripts' prompt) beside it."""
import sys, tempfile, torch
from workers.allocator import retain_freed_memory
from ragkv.bench.rag_dataset import make_queries
from workers.attention import query_blocks
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.prompt import build_prompt
from workers.requests import GenerateRequest

retain_freed_memory()
eng = Engine(EngineConfig(store=f"disk:{tempfile.mkdtemp()}", sequence_cache=False))
r = eng.runner
saved = {}
for seed in (0, 8, 9):
    q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=seed)[0]
    eng.generate(GenerateRequest(question=q.question, chunks=q.chunks, mode="reuse", max_new_tokens=1))
    layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
    rows = {}

    def observer(layer, qq, positions, kv):
        if layer == 10:
            blocks = query_blocks(positions, kv.positions) or [(0, positions.numel(), 0, kv.positions.numel())]
            rows["rows"] = positions.numel()
            rows["blocked"] = sum((b - a) * (hi - lo) for a, b, lo, hi in blocks)
            rows["exact"] = int((positions + 1).sum())
            rows["mean_position"] = float(positions.float().mean())
            rows["positions"] = positions.tolist()
    plan = plan_for("blend", BlendConfig(recompute_ratio=0.15))
    held = eng.scheduler.call(lambda: HeldChunks(r.chunk_kv(layout.prefix_ids), [r.chunk_kv(r.tokenize(c)).with_rope(True) for c in q.chunks]))
    for name, source in (("stored doc form", eng.chunks.for_request("", [None] * 8, lambda: False)), ("held alone form", held)):
        eng.scheduler.call(lambda: run_prefill(r, layout, plan, source, eng.config.chunk_form, observer=observer))
        print(f"seed {seed} {name}: {layout.num_tokens} tokens, layer 10: {rows['rows']} rows, mean position "
              f"{rows['mean_position']:.0f}, key-rows blocked {rows['blocked']} vs exact {rows['exact']} "
              f"(+{rows['blocked'] / rows['exact'] - 1:.0%})")
        saved.setdefault(name, []).append((rows["positions"], layout.num_tokens))
torch.save(saved, "research/results/2026-12-07-ninth/coverage_positions.pt")
eng.close()
