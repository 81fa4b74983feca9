"""Decode step time against batch size, avx2 and int4 kernels, 300 cached tokens per row."""
import time, torch
from workers.runner import ModelRunner
from workers.cache import KVCache, LayerKV
from workers.batching.step import decode_step
r = ModelRunner.load()
ids = torch.tensor(r.tokenize(open('README.md').read())[:300])
cache = KVCache.empty(r.shape.num_layers)
r.forward(ids, torch.arange(len(ids)), cache)
n = len(ids)
def clone(c): return KVCache([LayerKV(l.keys.clone(), l.values.clone(), l.positions.clone()) for l in c.layers])
for k in ("avx2", "int4"):
    w = r.decode_weights(k, 16)
    for B in (1, 2, 4, 8, 16):
        caches = [clone(cache) for _ in range(B)]
        decode_step(r, w, [5]*B, [n]*B, caches)
        t=time.perf_counter(); S=10
        for i in range(S): decode_step(r, w, [5]*B, [n+1+i]*B, caches)
        dt=(time.perf_counter()-t)/S*1e3
        print(f"{k} B={B}: {dt:.1f} ms/step, {B/dt*1e3:.0f} tok/s")
