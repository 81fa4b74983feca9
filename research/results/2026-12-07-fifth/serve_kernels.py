"""8 SDK clients, blend requests (48 new tokens, 2 per client), against four servers in turn: batched
(--max-batch 16) and one at a time, each with the avx2 and the int4 decode kernel; one run, same requests."""
import json, sys, tempfile
from pathlib import Path
from ragkv.bench.serve import CHUNKS_PER_REQUEST, corpus, requests_for, serve_once

chunks = corpus(CHUNKS_PER_REQUEST * 16)
groups = [chunks[i:i + CHUNKS_PER_REQUEST] for i in range(0, len(chunks), CHUNKS_PER_REQUEST)]
plan = {"groups": groups, "client_counts": (8,), "per_client": 2, "max_new_tokens": 48,
        "warmup": requests_for(1, groups, 4)[0]}
out = {}
with tempfile.TemporaryDirectory() as tmp:
    for kernel in ("avx2", "int4"):
        for name, batch in (("batched", "16"), ("one_at_a_time", "1")):
            d = Path(tmp) / f"{kernel}-{name}"; d.mkdir()
            r = serve_once(d, ("--max-batch", batch, "--no-sequence-cache", "--decode-kernel", kernel), plan, None)
            out[f"{kernel}/{name}"] = {"wall_s": r["clients"][8]["wall_s"], "ttft_p50_s": r["clients"][8]["ttft_p50_s"],
                                       "tokens": r["tokens"][8]}
            print(kernel, name, out[f"{kernel}/{name}"]["wall_s"], file=sys.stderr, flush=True)
tokens = {k: v.pop("tokens") for k, v in out.items()}
out["tokens_equal_across_servers_of_a_kernel"] = {k: tokens[f"{k}/batched"] == tokens[f"{k}/one_at_a_time"] for k in ("avx2", "int4")}
print(json.dumps(out, indent=2))
