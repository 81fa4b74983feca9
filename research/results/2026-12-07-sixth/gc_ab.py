"""A/B: the idle-time full collection before (HEAD~ worktree: no gc.freeze) and after (this tree), one client
sending requests back to back; client-side time to the first streamed piece and server-side ttft_s."""
import json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
from client import RagKVClient
from ragkv.bench.load import corpus
from kvstore.testing import free_port

def start(tree, workdir):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "ragkv.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                          "--store", f"disk:{workdir}/store", "--no-sequence-cache"], cwd=tree, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("ragkv listening"): break
    return p, f"127.0.0.1:{port}"

chunks = corpus(12)
out = {}
with tempfile.TemporaryDirectory() as tmp:
    servers = {name: start(tree, Path(tmp, name)) for name, tree in (("old", sys.argv[1]), ("new", sys.argv[2]))}
    for name, (_, target) in servers.items():
        with RagKVClient(target) as c:
            c.ingest(chunks); c.generate("Warm up?", chunks=chunks[:3], mode="full", max_new_tokens=2)
    rows = {"old": [], "new": []}
    for order in (("old", "new"), ("new", "old"), ("old", "new")):
        for name in order:
            with RagKVClient(servers[name][1]) as c:
                for i in range(6):
                    t = time.perf_counter(); first = None
                    stream = c.generate_stream(f"Question {i}: what is said?", chunks=chunks[i:i + 3], mode="full", max_new_tokens=8)
                    for _ in stream:
                        first = first or time.perf_counter()
                    rows[name].append((first - t, stream.result.ttft_s, time.perf_counter() - t))
    for p, _ in servers.values():
        p.terminate(); p.wait()
for name, r in rows.items():
    out[name] = {"client_ttft_median_s": round(statistics.median(a for a, _, _ in r), 4),
                 "server_ttft_median_s": round(statistics.median(b for _, b, _ in r), 4),
                 "client_request_median_s": round(statistics.median(c for _, _, c in r), 4),
                 "client_request_total_s": round(sum(c for _, _, c in r), 3), "requests": len(r)}
print(json.dumps(out, indent=1))
