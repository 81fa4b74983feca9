"""Where a cold wk4v3 block decode goes: one 128-token chunk of the default model encoded once, decoded N times,
torch profiler over the decodes (ops by self time)."""
import time, statistics, torch
from kvstore.codecs.base import make_codec

torch.manual_seed(0)
L, H, T, D = 30, 3, 128, 64
keys, values = torch.randn(L, H, T, D), torch.randn(L, H, T, D)
codec = make_codec("wk4v3")
payload = codec.encode(keys, values) if hasattr(codec, "encode") else None
shape = (L, H, T, D)
ts = []
for _ in range(20):
    t = time.perf_counter(); codec.decode(payload, shape, torch.float32); ts.append(time.perf_counter() - t)
print(f"decode: {statistics.median(ts) * 1e3:.2f} ms")
with torch.profiler.profile() as p:
    for _ in range(10):
        codec.decode(payload, shape, torch.float32)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
