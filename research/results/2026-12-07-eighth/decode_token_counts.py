"""wk4v3 block decode (the engine's codec, with the model's key plan) over token counts 118-145, each count once
then again, this checkout. Run from two checkouts (PYTHONPATH) to A/B the token-major key decode."""
import statistics, time, torch
from workers.allocator import retain_freed_memory
retain_freed_memory()
from workers.key_plan import codec_for_model
from workers.runner import ModelRunner
r = ModelRunner.load("default").with_kernel("bf16")
codec = codec_for_model("wk4v3", r)
base = r.tokenize("The lighthouse keeper counted ships every evening in a green ledger. " * 20)
blocks = []
for n in range(118, 146):
    kv = r.chunk_kv(base[:n]).with_rope(True)
    blocks.append((codec.encode(kv.keys, kv.values), tuple(kv.keys.shape)))
for label in ("first sight per count", "second time"):
    ts = []
    for payload, shape in blocks:
        t = time.perf_counter(); codec.decode(payload, shape, torch.float32); ts.append(time.perf_counter() - t)
    print(label, "ms per block", round(statistics.median(ts) * 1e3, 2))
