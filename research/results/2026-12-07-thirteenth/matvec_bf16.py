"""(Runs with bf16_decode_kernel.patch applied: the `bf16` decode kernel was not kept.)
avx2.c's matvec, 16-bit codes against bf16 arithmetic, per matrix of the default model at 1-16 rows."""
import time, torch
from workers.runner import ModelRunner
from workers.batching import avx2

r = ModelRunner.load()
L = r.layers[0]
mats = {"qkv": torch.cat([L.self_attn.q_proj.weight, L.self_attn.k_proj.weight, L.self_attn.v_proj.weight]),
        "gate_up": torch.cat([L.mlp.gate_proj.weight, L.mlp.up_proj.weight]), "down": L.mlp.down_proj.weight,
        "lm_head": r.model.lm_head.weight}
for name, w in mats.items():
    blocks = avx2.pack(w.detach())
    ref = w.detach().to(torch.bfloat16).float()
    for rows in (1, 8, 16):
        x = torch.randn(rows, w.shape[1])
        res = {}
        for bf16 in (False, True):
            avx2.matvec(blocks, x, bf16=bf16)
            ts = []
            for _ in range(9):
                t = time.perf_counter(); out = avx2.matvec(blocks, x, bf16=bf16); ts.append(time.perf_counter() - t)
            res[bf16] = sorted(ts)[4]
        want = x.to(torch.bfloat16).float() @ ref.T
        err = (avx2.matvec(blocks, x, bf16=True) - want).abs().max().item()
        print(f"{name:8s} {tuple(w.shape)} rows {rows:2d}: codes {res[False] * 1e3:6.3f} ms  bf16 {res[True] * 1e3:6.3f} ms"
              f"  ({res[False] / res[True]:.2f}x)  |bf16 - bf16 reference| {err:.2e}")
