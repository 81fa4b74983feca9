"""oneDNN's prepacked bf16 weights: does the batch-size hint matter? Packed once (hint None, 1, 64, 1024),
timed at the row counts a prefill uses; fp32 output as the projections need it."""
import time, statistics, torch
import torch.nn.functional as F
torch.manual_seed(0)
def med(fn, k=60):
    fn(); ts = []
    for _ in range(k):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3
lin = lambda x, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
with torch.inference_mode():
    w = (torch.randn(3072, 576) / 24).to(torch.bfloat16)
    packs = {h: torch.ops.mkldnn._reorder_linear_weight(w, h) for h in (None, 1, 64, 1024)}
    for m in (1, 25, 185, 505, 1116):
        x = torch.randn(m, 576).to(torch.bfloat16)
        ref = F.linear(x, w)
        row = [f"plain {med(lambda: F.linear(x, w).float()):.3f}"]
        for h, p in packs.items():
            row.append(f"hint {h}: {med(lambda: lin(x, p).float()):.3f}{'' if torch.equal(lin(x, p), ref) else ' DIFF'}")
        print(m, "; ".join(row))
