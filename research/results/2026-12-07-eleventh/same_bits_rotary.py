"""Does the C rotation of queries and keys (workers/rotary.py) change a forward pass? Both models, the bench's first
prompt laid out in full (8 chunks), the runner's forward with rotary.rows_fit as it is and forced to False:
logits and every layer's cache compared bit for bit."""
import torch
import workers.rotary as rotary
from ragkv.bench.rag_dataset import make_queries
from workers.cache import KVCache
from workers.prompt import build_prompt
from workers.runner import ModelRunner

fits = rotary.rows_fit
for model in ("default", "gemma3-270m"):
    r = ModelRunner.load(model).with_kernel("auto")
    q = make_queries(1, 8, 128, lambda t: len(r.tokenize(t)), seed=0)[0]
    layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
    ids, positions = torch.tensor(layout.token_ids), torch.arange(layout.num_tokens)
    runs = []
    for use in (fits, lambda *a: False):
        rotary.rows_fit, taken = (lambda *a: (taken.append(use(*a)), taken[-1])[1]), []
        cache = KVCache.empty(r.shape.num_layers)
        logits = r.forward(ids, positions, cache)
        runs.append((logits, cache, sum(taken)))
    rotary.rows_fit = fits
    (la, ca, na), (lb, cb, _) = runs
    same = all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(ca.layers, cb.layers))
    print(f"{model}: C pass for {na} rotations; logits equal {torch.equal(la, lb)}, cache equal {same}")
