import time, torch, statistics
from workers.runner import ModelRunner
from workers.cache import KVCache
r = ModelRunner.load("default")
ids = torch.tensor((r.tokenize("The lighthouse keeper counted ships every evening in a green ledger. ") * 80)[:1120])
with torch.inference_mode():
    ts = []
    for _ in range(4):
        c = KVCache.empty(r.shape.num_layers); t = time.perf_counter(); r.forward(ids, torch.arange(len(ids)), c); ts.append(time.perf_counter() - t)
print("1120-token fp32 prefill s:", [round(x, 2) for x in ts])
