"""One late decoder layer's parts (bf16 kernel, the row kernel), for blend@0.15-sized scattered rows (185 of 1,116,
skewed late) and for a whole 1,116-token prompt: qkv (norm, projection, RoPE), the cache write, attention, o, the MLP
(norm, gate|up, act x up, down), each timed alone, medians of 50 runs, alternated."""
import statistics, time, torch
from workers.allocator import retain_freed_memory
from workers.runner import ModelRunner
from workers.attention import plan_attention
torch.manual_seed(0)
retain_freed_memory()  # as the engine does: freed host memory kept, no fresh pages per call
r = ModelRunner.load().with_kernel("auto")
T, layer = 1116, 20
block = r.layers[layer]
kv_keys, kv_vals = torch.randn(3, T, 64), torch.randn(3, T, 64)
kp = torch.arange(T)
w = torch.arange(T - 25).float() + 200
cases = {"185 scattered": torch.cat([torch.sort(torch.multinomial(w, 160)).values, torch.arange(T - 25, T)]), "1116 prompt": kp}
def parts(at):
    S = at.numel()
    hidden = torch.randn(S, 576)
    plan = plan_attention(at, kp, None, 9, None, torch.float32)
    normed = block.input_layernorm(hidden)
    q, k, v = r.qkv(layer, normed, at)
    out = plan.run(q, kv_keys, kv_vals, 0.125)
    o = r.projections.o(layer, out)
    h2 = hidden + o
    n2 = block.post_attention_layernorm(h2)
    lay = r.projections.layers[layer]
    gu = lay.gate_up(n2.to(torch.bfloat16))
    gate, up = gu.float().chunk(2, dim=-1)
    act = (lay.act(gate) * up).to(torch.bfloat16)
    def write():
        kv_keys[:, at] = k; kv_vals[:, at] = v
    return {
        "norm": lambda: block.input_layernorm(hidden),
        "qkv proj": lambda: r.projections.qkv(layer, normed),
        "qkv+rope": lambda: r.qkv(layer, normed, at),
        "cache write": write,
        "attention": lambda: plan.run(q, kv_keys, kv_vals, 0.125),
        "o": lambda: r.projections.o(layer, out),
        "residual+norm": lambda: block.post_attention_layernorm(hidden + o),
        "gate_up": lambda: lay.gate_up(n2.to(torch.bfloat16)),
        "act*up": lambda: (lay.act(gu.float().chunk(2, dim=-1)[0]) * gu.float().chunk(2, dim=-1)[1]).to(torch.bfloat16),
        "down": lambda: lay.down(act).float(),
        "layer": lambda: r.layer_forward(layer, hidden, at, cache, slots=at),
    }
from workers.cache import KVCache, LayerKV
cache = KVCache([LayerKV(kv_keys.clone(), kv_vals.clone(), kp, None) for _ in range(30)])
with torch.inference_mode():
    fns = {name: parts(at) for name, at in cases.items()}
    ts = {(c, p): [] for c in fns for p in fns[c]}
    for _ in range(50):
        for c, ps in fns.items():
            for p, f in ps.items():
                t = time.perf_counter(); f(); ts[c, p].append(time.perf_counter() - t)
for p in fns["1116 prompt"]:
    a, b = statistics.median(ts["185 scattered", p]) * 1e3, statistics.median(ts["1116 prompt", p]) * 1e3
    print(f"{p:14s} 185 scattered {a:6.3f} ms   1116 prompt {b:7.3f} ms   ratio {a / b:.3f}")
