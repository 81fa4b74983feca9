"""fp32 GEMM efficiency against the row count (gate_up shape): small-M projections run at a fraction of the big-M rate."""
import time, torch
W = torch.randn(3072, 576)
Wt = W.t().contiguous()
def bench(f, n=30):
    f(); t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n
for M in (1, 8, 25, 64, 190, 1120):
    x = torch.randn(M, 576)
    t1 = bench(lambda: torch.nn.functional.linear(x, W))
    t2 = bench(lambda: torch.mm(x, Wt))
    fl = 2*M*576*3072
    s = f"M={M}: linear {fl/t1/1e9:.0f} GFLOP/s ({t1*1e6:.0f} us), mm(x, Wt) {fl/t2/1e9:.0f}"
    try:
        pw = torch.ops.mkl._mkl_reorder_linear_weight(W, M)
        t3 = bench(lambda: torch.ops.mkl._mkl_linear(x, pw, W, None, M))
        s += f", mkl packed {fl/t3/1e9:.0f}"
    except Exception as e:
        s += f", mkl packed n/a {str(e)[:80]}"
    print(s)
