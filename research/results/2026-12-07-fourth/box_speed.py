import time, torch
from workers.runner import ModelRunner
from workers.cache import KVCache
r = ModelRunner.load("default")
ids = torch.randint(100, 20000, (1120,))
for i in range(4):
    t = time.perf_counter(); r.forward(ids, torch.arange(1120), KVCache.empty(r.shape.num_layers)); print(round(time.perf_counter() - t, 3))
