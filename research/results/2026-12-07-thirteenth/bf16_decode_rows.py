"""Could the prefill's bf16 projections (oneDNN, packed) run batched decode? Per step: all 30 layers' four
matmuls plus the LM head at M rows, and whether row i's bits depend on M (batch invariance)."""
import time, torch
from workers.runner import ModelRunner
from workers.projections import Bf16Matrix

r = ModelRunner.load().with_kernel("bf16")
P = r.projections
mats = [(m, k) for lay in P.layers for m, k in ((lay.qkv, 576), (lay.o, 576), (lay.gate_up, 576), (lay.down, 1536))]
mats.append((P.lm_head, 576))
torch.manual_seed(0)
X = {k: torch.randn(32, k).to(torch.bfloat16) for k in (576, 1536)}
ref = [m(X[k][:1].contiguous()) for m, k in mats[:8]] + [P.lm_head(X[576][:1].contiguous())]
for M in (1, 2, 3, 4, 8, 16, 32):
    # invariance: row 0 alone vs among M rows, for the first two layers and the head
    same = all(torch.equal(m(X[k][:M].contiguous())[:1], ref[i]) for i, (m, k) in enumerate(mats[:8] + [mats[-1]]))
    xs = {k: X[k][:M].contiguous() for k in X}
    for _ in range(3):
        for m, k in mats:
            m(xs[k])
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        for m, k in mats:
            m(xs[k])
        ts.append(time.perf_counter() - t)
    ts.sort()
    print(f"M={M:2d}: step matmuls {ts[3] * 1e3:6.2f} ms ({ts[3] * 1e3 / M:5.2f} ms/row)  row 0 same bits as alone: {same}")
