import time, torch, statistics
from workers.runner import ModelRunner
from workers.cache import KVCache, LayerKV
from workers.context_drift import context_drift, shift_chunks
from kvstore.rope import apply_rope, rope_cos_sin
r = ModelRunner.load("default"); s = r.shape
drift = context_drift(r)
n = 1150
keys = torch.randn(s.num_layers, s.num_kv_heads, n, s.head_dim); values = torch.randn_like(keys)
pos = torch.arange(n)
cache = KVCache([LayerKV(keys[i], values[i], pos) for i in range(s.num_layers)])
span = (30, 170, 1120)
def old():
    shift_chunks(cache, span, drift, r.inv_freq)
def new():
    start, first_end, end = span
    p = torch.arange(start, end)
    slots = (p >= first_end).long()
    cos, sin = rope_cos_sin(p, r.inv_freq)
    dk = drift.keys.permute(1, 2, 0, 3)[:, :, slots]  # [L, H, T, D]
    keys[:, :, start:end] += apply_rope(dk, cos, sin)
    values[:, :, start:end] += drift.values.permute(1, 2, 0, 3)[:, :, slots]
with torch.inference_mode():
    for f in (old, new, old, new):
        ts = []
        for _ in range(10):
            t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
        print(f.__name__, round(statistics.median(ts) * 1000, 2), "ms")
    # equality
    k0 = keys.clone(); v0 = values.clone(); old(); k1 = keys.clone(); v1 = values.clone()
    keys.copy_(k0); values.copy_(v0); new()
    print("max diff keys", float((keys - k1).abs().max()), "values", float((values - v1).abs().max()))
