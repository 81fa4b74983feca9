"""SDPA's CPU cost per key-row (one query row against one cached entry, all 9 heads) for blend-sized blocks:
unmasked, under an additive mask, and the causal pass full prefill runs. fp32 and bf16."""
import torch
import torch.nn.functional as F
from timing import med
torch.manual_seed(0)
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
for dtype in (torch.float32, torch.bfloat16):
    T = 1116
    q, k, v = torch.randn(1, 9, T, 64, dtype=dtype), torch.randn(1, 3, T, 64, dtype=dtype), torch.randn(1, 3, T, 64, dtype=dtype)
    t = med(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), 10)
    print(dtype, f"causal {T}: {t*1e3:.2f} ms, {t/(T*(T+1)/2)*1e9:.1f} ns/key-row")
    for m in (16, 32, 57, 64, 96, 128, 185, 256):
        for keys in (440, 1116):
            qq = q[:, :, :m].contiguous(); kk, vv = k[:, :, :keys].contiguous(), v[:, :, :keys].contiguous()
            mask = torch.zeros(1, 1, m, keys, dtype=dtype)
            tu = med(lambda: F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True))
            tm = med(lambda: F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True))
            tl = med(lambda: flash(qq, kk, vv, 0.0, False, scale=0.125))
            kr = m * keys
            print(f"  m={m:4d} T={keys:5d}: unmasked {tu/kr*1e9:5.1f}  masked {tm/kr*1e9:5.1f}  flash+lse {tl/kr*1e9:5.1f} ns/key-row  ({tu*1e6:.0f} us)")
