"""The last prompt token's logits: the model's fp32 lm_head against bf16 weights (plain and prepacked)."""
import time, statistics, torch
import torch.nn.functional as F
from workers.runner import ModelRunner
r = ModelRunner.load("default")
w = r.model.lm_head.weight.detach()
print("lm_head", tuple(w.shape), w.dtype)
def med(fn, k=40):
    fn(); ts = []
    for _ in range(k):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3
with torch.inference_mode():
    x = torch.randn(1, w.shape[1])
    wb = w.to(torch.bfloat16)
    packed = torch.ops.mkldnn._reorder_linear_weight(wb, 1)
    xb = x.to(torch.bfloat16)
    print(f"fp32 {med(lambda: F.linear(x, w)):.2f} ms; bf16 {med(lambda: F.linear(xb, wb)):.2f} ms; "
          f"bf16 prepacked {med(lambda: torch.ops.mkldnn._linear_pointwise(xb, packed, None, 'none', [], '')):.2f} ms")
