"""cProfile of batch-B decode steps (avx2 kernel, CONTEXT cached tokens a row): where a step's Python goes."""
import cProfile, os, pstats, sys, time
import torch
from workers.runner import ModelRunner
from workers.batching.step import decode_step
from workers.cache import KVCache, LayerKV
from ragkv.bench.rag_dataset import make_queries
from workers.prompt import build_prompt

r = ModelRunner.load()
q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=0)[0]
layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
ids = torch.tensor(layout.token_ids[-int(os.environ.get("CONTEXT", 128)):])
base = KVCache.empty(r.shape.num_layers)
first = int(r.forward(ids, torch.arange(len(ids)), base).argmax())
n, b = len(ids), int(os.environ.get("B", 8))
w = r.decode_weights(sys.argv[1] if len(sys.argv) > 1 else "avx2", 16)
caches = [KVCache([LayerKV(l.keys.clone(), l.values.clone(), l.positions.clone()) for l in base.layers]) for _ in range(b)]
toks = [first] * b
for s in range(3):
    toks = decode_step(r, w, toks, [n + s] * b, caches).argmax(-1).tolist()
p = cProfile.Profile()
t = time.perf_counter()
p.enable()
for s in range(3, 23):
    toks = decode_step(r, w, toks, [n + s] * b, caches).argmax(-1).tolist()
p.disable()
print(f"{(time.perf_counter() - t) / 20 * 1e3:.1f} ms/step (profiled)")
pstats.Stats(p).sort_stats("tottime").print_stats(18)
