"""SDPA on this CPU (fp32, D=64, GQA 9/3): masked, unmasked, repeated K/V, the flash op."""
import time, torch, torch.nn.functional as F
torch.manual_seed(0)
Hq, Hkv, D = 9, 3, 64
def bench(f, n=30):
    f(); t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e3
for S, T in ((64, 1120), (64, 560), (190, 1120)):
    q = torch.randn(1, Hq, S, D); k = torch.randn(1, Hkv, T, D); v = torch.randn(1, Hkv, T, D)
    mask = torch.rand(1, 1, S, T) > 0.3
    kr = k.repeat_interleave(3, 1); vr = v.repeat_interleave(3, 1)
    a = bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
    b = bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    c = bench(lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask))
    d = bench(lambda: F.scaled_dot_product_attention(q, kr, vr))
    e = bench(lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, kr, vr, 0.0, False))
    fl = 4*S*T*D*Hq/1e9
    print(f"S={S} T={T}: gqa masked {a:.2f} ms ({fl/a*1e3:.0f} GF/s), gqa nomask {b:.2f}, rep masked {c:.2f}, rep nomask {d:.2f}, flash op {e:.2f}")
