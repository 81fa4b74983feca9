"""bf16 projections: F.linear on plain weights (today) against oneDNN's prepacked weights
(torch.ops.mkldnn._reorder_linear_weight + _linear_pointwise, what inductor's freezing uses), by rows."""
import time, statistics, torch
import torch.nn.functional as F
torch.manual_seed(0)

def med(fn, k=100):
    fn(); ts = []
    for _ in range(k):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3

with torch.inference_mode():
    for n, kdim in ((3072, 576), (576, 1536), (960, 576)):
        w = (torch.randn(n, kdim) / 24).to(torch.bfloat16)
        for m in (1, 25, 185, 505, 1116):
            x = torch.randn(m, kdim).to(torch.bfloat16)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
            a = med(lambda: F.linear(x, w))
            b = med(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
            same = torch.equal(F.linear(x, w), torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
            print(f"[{m:4d},{kdim}]x[{kdim},{n}]: F.linear {a:6.3f} ms, prepacked {b:6.3f} ms ({a / b:4.2f}x) equal={same}")
