"""Decode step at batch 1: time in the C layers, the lm_head and the rest (python decode_step_timing.py TOKENS)."""
import time, torch, sys
from workers.runner import ModelRunner
from workers.cache import KVCache, LayerKV
from workers.batching.step import decode_step
from workers.batching import avx2
r = ModelRunner.load()
N = int(sys.argv[1]) if len(sys.argv) > 1 else 1100
ids = torch.tensor((r.tokenize(open('README.md').read())*3)[:N])
cache = KVCache.empty(r.shape.num_layers)
logits = r.forward(ids, torch.arange(len(ids)), cache)
tok = int(logits.argmax()); n = len(ids)
w = r.decode_weights("avx2", 4)
acc = {"layer": 0.0, "head": 0.0}
orig = avx2.NativeLayer.__call__
def timed(self, h, rows):
    t = time.perf_counter(); out = orig(self, h, rows); acc["layer"] += time.perf_counter() - t; return out
avx2.NativeLayer.__call__ = timed
lm = w.lm_head
class H:
    def __call__(s, x):
        t = time.perf_counter(); o = lm(x); acc["head"] += time.perf_counter() - t; return o
w.lm_head = H()
decode_step(r, w, [tok], [n], [cache])
for rep in range(2):
    acc.update(layer=0.0, head=0.0)
    t0=time.perf_counter(); S=40
    for i in range(S):
        out = decode_step(r, w, [tok], [n+1+i+rep*S], [cache]); tok=int(out.argmax())
    tot=(time.perf_counter()-t0)/S*1e3
    print("N=%d step %.2f ms: layers %.2f, lm_head %.2f, rest %.2f" % (N, tot, acc["layer"]/S*1e3, acc["head"]/S*1e3, tot-(acc["layer"]+acc["head"])/S*1e3))
