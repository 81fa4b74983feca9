"""avx2 step error against fp32: the lm_head alone, the final hidden state, the logits."""
import torch
from workers.runner import ModelRunner
from workers.cache import KVCache, LayerKV
from workers.batching.step import decode_step
from workers.batching import avx2
r = ModelRunner.load()
ids = torch.tensor(r.tokenize(open('README.md').read())[:1100])
cache = KVCache.empty(r.shape.num_layers)
logits = r.forward(ids, torch.arange(len(ids)), cache)
tok = int(logits.argmax()); n = len(ids)
def clone(c): return KVCache([LayerKV(l.keys.clone(), l.values.clone(), l.positions.clone()) for l in c.layers])
W = {k: r.decode_weights(k, 4) for k in ("fp32", "int4", "avx2")}
# final hidden: capture via lm_head input
cap = {}
for k, w in W.items():
    orig = w.lm_head
    class Cap:
        def __call__(s, x, orig=orig, k=k): cap[k] = x.clone(); return orig(x)
    w.lm_head = Cap()
    decode_step(r, w, [tok], [n], [clone(cache)])
    w.lm_head = orig
h = cap["fp32"]
E = r.model.lm_head.weight.detach()
ref = h @ E.T
for k in ("int4", "avx2"):
    print(k, "lm_head alone err", (W[k].lm_head(h) - ref).abs().max().item(), "hidden rel err", ((cap[k]-h).norm()/h.norm()).item(),
          "logit err via fp32 head", (cap[k] @ E.T - ref).abs().max().item())
print("logit scale", ref.abs().max().item(), ref.std().item())
