"""`ragkv bench serve`'s 8-client workload (blend requests at the server's setting, 48 new tokens, 2 per client)
against a batched server (--max-batch 16) and one at a time (--max-batch 1), one run. Per request, from its
stats: the prefill's compute (its breakdown without the queue and the prompt's preparation) and its decode time (total - ttft) on the
one-at-a-time server. The batched wall can never be below the sum of the prefills (they run one after
another on the same cores), so (prefills + decodes) / prefills bounds the ratio even for a free batched decode."""
import json, sys, tempfile, threading, time
from pathlib import Path
from client import RagKVClient
from ragkv.bench.load import ServerProcess, run_clients
from ragkv.bench.serve import CHUNKS_PER_REQUEST, MEMORY_BUDGET, corpus, requests_for

CLIENTS, PER_CLIENT, NEW = 8, 2, 48
chunks = corpus(CHUNKS_PER_REQUEST * 16)
groups = [chunks[i:i + CHUNKS_PER_REQUEST] for i in range(0, len(chunks), CHUNKS_PER_REQUEST)]
requests = requests_for(CLIENTS * PER_CLIENT, groups, NEW)
out = {}
with tempfile.TemporaryDirectory() as tmp:
    for name, batch in (("batched", "16"), ("one_at_a_time", "1")):
        d = Path(tmp) / name; d.mkdir()
        server = ServerProcess(d, MEMORY_BUDGET, ("--max-batch", batch, "--no-sequence-cache"))
        server.wait_ready(300)
        target = f"127.0.0.1:{server.port}"
        with RagKVClient(target, timeout=600) as c:
            c.ingest(chunks); c.generate(**requests_for(1, groups, 4)[0])
        results = [None] * len(requests)

        def loop(k):
            with RagKVClient(target, timeout=600) as c:
                for i in range(k, len(requests), CLIENTS):
                    results[i] = c.generate(**requests[i])
        wall = run_clients(loop, CLIENTS)
        server.stop()
        prefill = sum(sum(v for k, v in r.stats["breakdown"].items() if k not in ("queue", "prompt")) for r in results)
        decode = sum(r.total_s - r.ttft_s for r in results)
        out[name] = {"wall_s": round(wall, 2), "prefill_compute_s": round(prefill, 2), "decode_s": round(decode, 2),
                     "blend_method": sorted({r.stats.get("blend_method") for r in results}),
                     "tokens": [list(r.token_ids) for r in results]}
        print(name, out[name]["wall_s"], out[name]["prefill_compute_s"], out[name]["decode_s"], file=sys.stderr, flush=True)
b, o = out["batched"], out["one_at_a_time"]
out["tokens_equal"] = b.pop("tokens") == o.pop("tokens")
out["ratio"] = round(o["wall_s"] / b["wall_s"], 2)
out["bound_free_decode"] = round(o["wall_s"] / b["prefill_compute_s"], 2)  # batched wall >= its prefills
print(json.dumps(out, indent=1))
