"""How far each attention path is from exact arithmetic: SDPA's plans and the row kernel against the same
attention in fp64, on a real prompt's queries, keys and values (the blend bench's first prompt, full prefill,
every layer), for the whole prompt in order and for blend-like scattered rows. Max and mean absolute error."""
import torch
from workers.allocator import retain_freed_memory
from workers.attention import plan_attention, visibility_mask
from workers.runner import ModelRunner
from ragkv.bench.rag_dataset import make_queries
from workers.prompt import build_prompt

retain_freed_memory()
r = ModelRunner.load().with_kernel("auto")
q0 = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=0)[0]
layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q0.chunks], q0.question)
seen = []
def observer(layer, q, positions, kv):
    seen.append((q.clone(), kv.keys.clone(), kv.values.clone(), positions.clone(), kv.positions.clone()))
from workers.cache import KVCache
ids = torch.tensor(layout.token_ids)
pos = torch.arange(layout.num_tokens)
with torch.inference_mode():
    cache = KVCache.empty(r.shape.num_layers)
    hidden = r.embed(ids)
    for layer in range(r.shape.num_layers):
        hidden = r.layer_forward(layer, hidden, pos, cache, observer=observer)
    torch.manual_seed(0)
    T = layout.num_tokens
    w = torch.arange(T - 25).float() + 200
    pick = torch.cat([torch.sort(torch.multinomial(w, 160)).values, torch.arange(T - 25, T)])
    stats = {}
    for q, k, v, qp, kp in seen:
        for name, rows in (("prompt", torch.arange(T)), ("scattered", pick)):
            qq, at = q[:, rows].contiguous(), qp[rows]
            mask = visibility_mask(at, kp, None, q.shape[0])  # [1, S, T]
            g = q.shape[0] // k.shape[0]
            s = torch.matmul(qq.double(), k.double().repeat_interleave(g, 0).transpose(1, 2)) * 0.125
            exact = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v.double().repeat_interleave(g, 0)
            exact = exact.transpose(0, 1).reshape(rows.numel(), -1)
            for path, use_rows in (("sdpa", False), ("rows", True)):
                out = plan_attention(at, kp, None, q.shape[0], None, torch.float32, rows=use_rows).run(qq, k, v, 0.125)
                err = (out.double() - exact).abs()
                st = stats.setdefault((name, path), [0.0, 0.0, 0])
                st[0] = max(st[0], err.max().item()); st[1] += err.mean().item(); st[2] += 1
for (name, path), (mx, total, n) in sorted(stats.items()):
    print(f"{name:9s} {path}: max |err| {mx:.2e}, mean |err| {total / n:.2e} (over {n} layers)")
