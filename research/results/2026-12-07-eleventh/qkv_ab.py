"""runner.qkv alone (projection, split, RoPE) for a whole 1,116-token prompt and for blend@0.15's 185 scattered
rows, the C rotation against apply_rope's torch ops, alternated, 40 rounds of 10 calls; medians per call."""
import statistics, time, torch
import workers.rotary as rotary
from workers.allocator import retain_freed_memory
from workers.runner import ModelRunner

retain_freed_memory()
r = ModelRunner.load().with_kernel("auto")
fits = rotary.rows_fit
cases = {"1116 rows": torch.arange(1116), "185 rows": torch.sort(torch.randperm(1116)[:185]).values}
times = {(c, v): [] for c in cases for v in ("torch", "C")}
with torch.inference_mode():
    normed = {c: torch.randn(len(p), 576) for c, p in cases.items()}
    for i in range(40):
        for v in (("torch", "C") if i % 2 else ("C", "torch")):
            rotary.rows_fit = fits if v == "C" else (lambda *a: False)
            for c, p in cases.items():
                t = time.perf_counter()
                for layer in range(10):
                    r.qkv(layer, normed[c], p)
                times[c, v].append((time.perf_counter() - t) / 10)
rotary.rows_fit = fits
for c in cases:
    a, b = statistics.median(times[c, "torch"]), statistics.median(times[c, "C"])
    print(f"{c}: qkv+rope torch {a * 1e3:.3f} ms  C {b * 1e3:.3f} ms  saves {(a - b) * 1e3:.3f} ms a layer ({a / b:.2f}x)")
