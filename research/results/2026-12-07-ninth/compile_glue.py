"""Can inductor fuse a recomputing layer's glue (RMSNorm -> bf16, SiLU x up -> bf16) on this CPU, and at what
compile cost? 185 rows, the default model's sizes."""
import time, statistics, torch
torch.set_num_threads(2)

def rms_bf16(x, w, eps: float = 1e-5):
    v = x.pow(2).mean(-1, keepdim=True)
    return (w * (x * torch.rsqrt(v + eps))).to(torch.bfloat16)

def silu_mul_bf16(gu):
    g, u = gu.chunk(2, dim=-1)
    return (torch.nn.functional.silu(g) * u).to(torch.bfloat16)

def med(fn, k=200):
    ts = []
    for _ in range(k):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6

x, w, gu = torch.randn(185, 576), torch.randn(576), torch.randn(185, 3072)
for name, fn, args in (("rms", rms_bf16, (x, w)), ("silu", silu_mul_bf16, (gu,))):
    t = time.perf_counter()
    c = torch.compile(fn, dynamic=True)
    c(*args)
    ct = time.perf_counter() - t
    assert torch.equal(c(*args).float(), fn(*args).float()) or print(name, "max diff", (c(*args).float() - fn(*args).float()).abs().max())
    with torch.inference_mode():
        print(f"{name}: compile {ct:.1f} s; eager {med(lambda: fn(*args)):.1f} us, compiled {med(lambda: c(*args)):.1f} us")
