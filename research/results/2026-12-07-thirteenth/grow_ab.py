"""A decode step's cache growth: every layer at once (KVCache.grow) against one layer at a time (the cache's stack
switched off), avx2 kernel, batch 1/8/16 over CONTEXT cached tokens a row (default 128), alternated in one process."""
import os, statistics, time
import torch
from workers.runner import ModelRunner
from workers.batching.step import decode_step
from workers.cache import KVCache, LayerKV
from ragkv.bench.rag_dataset import make_queries
from workers.prompt import build_prompt

r = ModelRunner.load().with_kernel("auto")
q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=0)[0]
layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
ids = torch.tensor(layout.token_ids[-int(os.environ.get("CONTEXT", 128)):])
base = KVCache.empty(r.shape.num_layers)
first = int(r.forward(ids, torch.arange(len(ids)), base).argmax())
n = len(ids)
w = r.decode_weights("avx2", 16)
steps, batches, variants = 24, (1, 8, 16), ("per-layer", "together")
times = {(v, b): [] for v in variants for b in batches}
for rnd in range(int(os.environ.get("ROUNDS", 11))):
    for v in variants[rnd % 2:] + variants[:rnd % 2]:
        for b in batches:
            caches = [KVCache([LayerKV(l.keys.clone(), l.values.clone(), l.positions.clone()) for l in base.layers])
                      for _ in range(b)]
            if v == "per-layer":
                for c in caches:
                    c._stack = False  # research only: the product switches it off when a layer is replaced
            toks = [first] * b
            decode_step(r, w, toks, [n] * b, caches)  # the first step builds the stack (or the layers' rooms)
            t = time.perf_counter()
            for s in range(1, steps + 1):
                toks = decode_step(r, w, toks, [n + s] * b, caches).argmax(-1).tolist()
            times[v, b].append((time.perf_counter() - t) / steps)
for b in batches:
    a, c = statistics.median(times["per-layer", b]), statistics.median(times["together", b])
    print(f"batch {b:2d}: per-layer {a * 1e3:6.2f} ms/step  together {c * 1e3:6.2f} ms/step  ({a / c:.3f}x)")
