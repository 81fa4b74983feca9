import gc, sys, time, tempfile
from workers.runner import ModelRunner
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.requests import GenerateRequest
r = ModelRunner.load("default")
t = time.perf_counter(); gc.collect(); print("full collect", round(time.perf_counter() - t, 3), "objects", len(gc.get_objects()))
t = time.perf_counter(); gc.collect(1); print("collect(1)", round(time.perf_counter() - t, 4))
CHUNKS = ["The lighthouse on Varn Point was painted green in 1911.",
          "Orla keeps her bees on the roof of the old mill.",
          "The ferry to Kell leaves at seven every morning."]
req = GenerateRequest(question="When does the ferry leave?", chunks=tuple(CHUNKS), max_new_tokens=4)
def run():
    t = time.perf_counter()
    for i in range(4):
        e = Engine(EngineConfig(store=f"disk:{tempfile.mkdtemp()}", memory_budget_bytes=None, sequence_cache=False, blend=BlendConfig()), r)
        for _ in range(3): e.generate(req)
        e.close()
    return time.perf_counter() - t
print("warm", round(run(), 2))
print("as is", round(run(), 2))
gc.collect(); gc.freeze()
t = time.perf_counter(); gc.collect(); print("full collect after freeze", round(time.perf_counter() - t, 4))
print("frozen", round(run(), 2))
