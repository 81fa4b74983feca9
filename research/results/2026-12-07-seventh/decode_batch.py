"""Decode step time against batch size (avx2 kernel), each row over its own ~250-token cache; and the time
of the layers' C calls alone (the rest is Python: per-row cache growth, masks, ctypes rows, embed, lm_head)."""
import copy, statistics, time, torch
from workers.runner import ModelRunner
from workers.cache import KVCache
from workers.batching.step import decode_step
import workers.batching.avx2 as avx2
r = ModelRunner.load("default")
w = r.decode_weights("avx2", 16)
ids = r.tokenize("The lighthouse keeper counted ships every evening in a green ledger. " * 20)[:250]
base = KVCache.empty(r.shape.num_layers)
r.forward(torch.tensor(ids), torch.arange(len(ids)), base)
c_time = [0.0]
orig = avx2.NativeLayer.__call__
def timed(self, hidden, rows):
    t = time.perf_counter(); out = orig(self, hidden, rows); c_time[0] += time.perf_counter() - t; return out
avx2.NativeLayer.__call__ = timed
for B in (1, 2, 4, 8, 16):
    caches = [copy.deepcopy(base) for _ in range(B)]
    steps = []
    c_time[0] = 0.0
    for s in range(12):
        t = time.perf_counter()
        decode_step(r, w, [ids[-1]] * B, [len(ids) + s] * B, caches)
        steps.append(time.perf_counter() - t)
    step = statistics.median(steps[2:])
    print(f"B={B:2d} step {step*1e3:6.1f} ms  per token {step/B*1e3:5.1f} ms  C layers {c_time[0]/12*1e3:6.1f} ms/step  tokens/s {B/step:6.1f}")
