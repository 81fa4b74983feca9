"""A cold block decode with the C dequantize (auto) against the torch reference (RAGKV_FORCE_TORCH=1), alternated:
one default-model chunk (30 layers x 3 kv heads x 64) of 128 and 256 tokens, every codec in the registry that the
product ships; medians of 30, and the same tensors checked."""
import os, statistics, time, torch
from kvstore.codecs.base import make_codec

torch.manual_seed(0)
for tokens in (128, 256):
    shape = (30, 3, tokens, 64)
    keys, values = torch.randn(shape), torch.randn(shape)
    for name in ("wk4v3", "kivi2", "int4", "int8"):
        codec = make_codec(name)
        payload = codec.encode(keys, values)
        times = {"0": [], "1": []}
        outs = {}
        for _ in range(30):
            for force in ("1", "0"):
                os.environ["RAGKV_FORCE_TORCH"] = force
                t = time.perf_counter()
                outs[force] = codec.decode(payload, shape, torch.float32)
                times[force].append(time.perf_counter() - t)
        same = all(torch.equal(a, b) for a, b in zip(outs["0"], outs["1"]))
        a, b = statistics.median(times["1"]) * 1e3, statistics.median(times["0"]) * 1e3
        print(f"{tokens} tokens {name:>6}: torch {a:6.2f} ms  C {b:6.2f} ms  ({a / b:.2f}x)  same: {same}")
