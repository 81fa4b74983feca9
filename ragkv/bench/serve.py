"""`ragkv bench serve`: continuous batching against one request at a time, side by side in one run.

Two real `ragkv serve` subprocesses in turn, the same settings but `--max-batch` (batched) and
`--max-batch 1` (unbatched). Each ingests the same chunks, then answers the same blend requests
(CHUNKS_PER_REQUEST cached chunks, `max_new_tokens` new tokens; at the servers' default setting, which they
serve by an exact prefill, or with `--recompute-ratio R` blended at R) from 1, 4, 8 and 16 SDK clients
over loopback. Per client count: requests/s, tokens/s and the time to first token (p50/p99) as
the clients see it (first streamed piece), and whether every request's tokens are identical in
the two servers (`tokens_equal`). Also: the 8 requests sent one after another against from 8
clients at once on the batched server (`concurrency`), and single-request decode speed per decode
kernel (`decode`). llama.cpp is not a dependency: research/ragkv_research/decode_vs_llama_cpp.py measures
its decode beside ragkv's from a separate environment, in one run.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from ragkv.bench.load import ServerProcess, corpus, percentile, run_clients

CLIENT_COUNTS = (1, 4, 8, 16)
CHUNKS_PER_REQUEST = 4
MAX_BATCH = 16
MEMORY_BUDGET = 256 << 20
QUESTIONS = ("Summarize these passages in detail.", "Which people, places and dates do the passages mention?",
             "Explain what the passages say, point by point.", "Write a detailed report on the passages.")


def requests_for(count: int, groups: list[list[str]], max_new_tokens: int) -> list[dict]:
    """The same `count` requests for both servers: request i over chunk group i, question i."""
    return [{"question": QUESTIONS[i % len(QUESTIONS)], "chunks": groups[i % len(groups)], "mode": "blend",
             "max_new_tokens": max_new_tokens} for i in range(count)]


def send_all(target: str, requests: list[dict], clients: int, progress=None) -> dict:
    """`clients` SDK clients share `requests` (client c sends c, c + clients, ...) -> figures and tokens."""
    from client import RagKVClient

    tokens: list[list[int] | None] = [None] * len(requests)
    ttfts: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client_loop(c: int) -> None:
        with RagKVClient(target, timeout=600) as cl:
            for i in range(c, len(requests), clients):
                started, first = time.perf_counter(), None
                try:
                    stream = cl.generate_stream(**requests[i])
                    for _piece in stream:
                        first = first or time.perf_counter()
                    result = stream.result
                except Exception as e:  # noqa: BLE001 - counted and reported
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}"[:200])
                    continue
                with lock:
                    tokens[i] = list(result.token_ids)
                    ttfts.append((first or time.perf_counter()) - started)
                if progress is not None:
                    progress.update(1)

    wall = run_clients(client_loop, clients)
    generated = sum(len(t) for t in tokens if t is not None)
    return {"figures": {"req_per_s": round(len(ttfts) / wall, 3), "tokens_per_s": round(generated / wall, 2),
                        "ttft_p50_s": round(percentile(ttfts, 0.5), 4), "ttft_p99_s": round(percentile(ttfts, 0.99), 4),
                        "wall_s": round(wall, 3), "requests": len(requests), "errors": len(errors)},
            "tokens": tokens, "error_samples": errors[:3]}


def decode_speed(target: str, max_new_tokens: int, repeats: int = 3) -> dict:
    """One request alone, `repeats` times: decode tokens/s = (generated - 1) / (total - time to first
    token), server-side; the median is the figure."""
    from client import RagKVClient

    speeds, tokens = [], 0
    with RagKVClient(target, timeout=600) as cl:
        for _ in range(repeats):
            result = cl.generate("Write a long story about a lighthouse keeper and the sea.", chunks=corpus(1),
                                 mode="full", max_new_tokens=max_new_tokens)
            tokens = len(result.token_ids)
            decode_s = result.total_s - result.ttft_s
            speeds.append(round((tokens - 1) / decode_s, 1) if decode_s > 0 else 0.0)
    return {"tokens": tokens, "tokens_per_s": sorted(speeds)[len(speeds) // 2], "runs": speeds}


def serve_once(workdir: Path, extra: tuple[str, ...], plan: dict, progress) -> dict:
    """Start one server, ingest, warm up, run every client count (and the extras) -> its figures."""
    from client import RagKVClient

    server = ServerProcess(workdir, MEMORY_BUDGET, extra)
    try:
        server.wait_ready(300)
        target = f"127.0.0.1:{server.port}"
        with RagKVClient(target, timeout=600) as cl:
            cl.ingest([c for group in plan["groups"] for c in group])
            cl.generate(**plan["warmup"])
        out = {"clients": {}, "tokens": {}}
        if plan.get("decode_tokens"):
            out["decode"] = decode_speed(target, plan["decode_tokens"])
        for clients in plan["client_counts"]:
            run = send_all(target, requests_for(plan["per_client"] * clients, plan["groups"], plan["max_new_tokens"]),
                           clients, progress)
            out["clients"][clients] = run["figures"]
            out["tokens"][clients] = run["tokens"]
        if plan.get("concurrency"):
            n = plan["concurrency"]
            same = requests_for(n, plan["groups"], plan["max_new_tokens"])
            one, many = send_all(target, same, 1, progress), send_all(target, same, n, progress)
            out["concurrency"] = {"requests": n, "sequential_s": one["figures"]["wall_s"],
                                  "concurrent_s": many["figures"]["wall_s"],
                                  "speedup": round(one["figures"]["wall_s"] / many["figures"]["wall_s"], 2),
                                  "tokens_equal": one["tokens"] == many["tokens"]}
        if plan.get("decode_tokens") and plan.get("client_counts"):  # the same, after the load
            out["decode_after_load"] = decode_speed(target, plan["decode_tokens"])
        return out
    finally:
        server.stop()


def run(quick: bool = False, progress: bool = True, max_batch: int = MAX_BATCH, plots: str | None = None,
        recompute_ratio: float | None = None) -> dict:
    from tqdm import tqdm

    client_counts = (1, 4) if quick else CLIENT_COUNTS
    per_client = 1 if quick else 2
    max_new_tokens = 16 if quick else 48
    chunks = corpus(CHUNKS_PER_REQUEST * 16)
    groups = [chunks[i:i + CHUNKS_PER_REQUEST] for i in range(0, len(chunks), CHUNKS_PER_REQUEST)]
    plan = {"groups": groups, "client_counts": client_counts, "per_client": per_client,
            "max_new_tokens": max_new_tokens, "warmup": requests_for(1, groups, 4)[0]}
    batched_plan = {**plan, "concurrency": 4 if quick else 8, "decode_tokens": 32 if quick else 128}
    total = sum(per_client * n for n in client_counts) * 2 + 2 * batched_plan["concurrency"]
    # the same blend requests must get the same tokens from both servers: no exact sequence tree, whose idle-time
    # fills would land at different moments in the two (ragkv bench blend --workload measures the tree)
    # the servers' ratio for requests that give none (None: the server's default, which it serves by an exact prefill)
    ratio = ("--recompute-ratio", str(recompute_ratio)) if recompute_ratio is not None else ()
    servers = {"batched": (("--max-batch", str(max_batch), "--no-sequence-cache", *ratio), batched_plan),
               "unbatched": (("--max-batch", "1", "--no-sequence-cache", *ratio), plan)}
    started = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="ragkv-serve-") as tmp, \
            tqdm(total=total, desc="serve", disable=not progress, file=sys.stderr) as bar:
        for name, (extra, server_plan) in servers.items():
            bar.set_postfix_str(name)
            workdir = Path(tmp) / name
            workdir.mkdir()
            results[name] = serve_once(workdir, extra, server_plan, bar)
        fp32_dir = Path(tmp) / "fp32"
        fp32_dir.mkdir()
        bar.set_postfix_str("fp32 decode")
        fp32 = serve_once(fp32_dir, ("--decode-kernel", "fp32", "--max-batch", "1"),
                          {**plan, "client_counts": (), "decode_tokens": batched_plan["decode_tokens"]}, None)
    batched, unbatched = results["batched"], results["unbatched"]
    out = {
        "clients": {n: {"batched": batched["clients"][n], "unbatched": unbatched["clients"][n],
                        "throughput_ratio": round(batched["clients"][n]["tokens_per_s"]
                                                  / max(unbatched["clients"][n]["tokens_per_s"], 1e-9), 2)}
                    for n in client_counts},
        "tokens_equal": all(batched["tokens"][n] == unbatched["tokens"][n] for n in client_counts)
        and batched["concurrency"]["tokens_equal"],
        "concurrency": batched["concurrency"],
        "decode": {"batched_default": batched["decode"], "batched_default_after_load": batched["decode_after_load"],
                   "fp32": fp32["decode"]},
        "settings": {"max_batch": max_batch, "chunks_per_request": CHUNKS_PER_REQUEST, "mode": "blend",
                     "recompute_ratio": "server default" if recompute_ratio is None else recompute_ratio,
                     "max_new_tokens": max_new_tokens, "requests_per_client": per_client},
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    if plots:
        out["plots"] = [plot(out, plots)]
    return out


def plot(result: dict, directory: str) -> str:
    """Throughput (tokens/s) against concurrent clients, batched vs unbatched -> the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted(result["clients"], key=int)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, style in (("batched", "o-"), ("unbatched", "s--")):
        ax.plot(counts, [result["clients"][n][name]["tokens_per_s"] for n in counts], style, label=name)
    ax.set_xlabel("concurrent SDK clients")
    ax.set_ylabel("generated tokens / s")
    ax.set_title("ragkv serve: continuous batching")
    ax.set_xticks(counts)
    ax.legend()
    ax.grid(alpha=0.3)
    path = Path(directory) / "serve-throughput.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
