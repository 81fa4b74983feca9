"""(Runs with bf16_decode_kernel.patch applied: the `bf16` decode kernel was not kept.)
Decode step time, avx2 against bf16, at batch 1..16 over ~1,100 cached tokens a row (CONTEXT=N: the last N) (in-process, alternated,
the median of each variant's rounds). Also: do the two kernels pick the same greedy tokens over 64 steps?"""
import statistics, sys, time
import torch
from workers.runner import ModelRunner
from workers.batching.step import decode_step
from workers.cache import KVCache, LayerKV
from ragkv.bench.rag_dataset import make_queries
from workers.prompt import build_prompt

r = ModelRunner.load().with_kernel("auto")
q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=0)[0]
layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
import os
ids = torch.tensor(layout.token_ids[-int(os.environ.get("CONTEXT", 100000)):])  # CONTEXT: the last N prompt tokens
base = KVCache.empty(r.shape.num_layers)
first = int(r.forward(ids, torch.arange(len(ids)), base).argmax())
n = len(ids)


def clone(cache):
    return KVCache([LayerKV(l.keys.clone(), l.values.clone(), l.positions.clone()) for l in cache.layers])


kernels = sys.argv[1:] or ["avx2", "bf16"]
weights = {k: r.decode_weights(k, 16) for k in kernels}
for k, w in weights.items():
    print(k, "->", w.kernel, w.kernels_used(), w.note)
steps = 8
times = {(k, b): [] for k in kernels for b in (1, 2, 4, 8, 16)}
for rnd in range(3):
    for k in kernels[rnd % 2:] + kernels[:rnd % 2]:
        for b in (1, 2, 4, 8, 16):
            caches = [clone(base) for _ in range(b)]
            toks = [first] * b
            t = time.perf_counter()
            for s in range(steps):
                logits = decode_step(r, weights[k], toks, [n + s] * b, caches)
                toks = logits.argmax(-1).tolist()
            times[k, b].append((time.perf_counter() - t) / steps)
for b in (1, 2, 4, 8, 16):
    line = f"batch {b:2d}:"
    for k in kernels:
        m = statistics.median(times[k, b])
        line += f"  {k} {m * 1e3:6.1f} ms/step ({b / m:6.1f} tok/s)"
    print(line)
# greedy agreement over 64 tokens, batch 1
outs = {}
for k in kernels:
    cache, tok, got = clone(base), first, []
    for s in range(64):
        tok = int(decode_step(r, weights[k], [tok], [n + s], [cache]).argmax())
        got.append(tok)
    outs[k] = got
    print(k, repr(r.detokenize(got))[:200])
same = next((i for i, (a, b) in enumerate(zip(*outs.values())) if a != b), 64)
print("first differing step:", same)
