"""`ragkv bench load`: concurrent SDK clients against a real `ragkv serve` subprocess.

16 clients over loopback share a corpus cut from the sample documents (workers/data/samples/docs) and send a
fixed number of requests, a mix of Ingest and Generate (blend, a few new tokens each). Reported:
errors (must be zero), latency p50/p99 per kind and overall, throughput, the server's peak RSS
(VmHWM from /proc), and the in-memory tier's bytes as polled through the Stats RPC the whole time,
against its byte budget. The server gets a small tier budget so the tier evicts during the run.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from workers.samples import sample_documents

CLIENTS = 16
MEMORY_BUDGET = 2 << 20  # small on purpose: the tier must evict, never exceed
QUESTIONS = ("What is this about?", "Who is mentioned?", "Where is it?", "When did it happen?")


def corpus(max_chunks: int) -> list[str]:
    """Short chunks (two sentences) from the sample documents."""
    chunks: list[str] = []
    for text in sample_documents().values():
        sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
        chunks += [" ".join(sentences[i:i + 2]) for i in range(0, len(sentences), 2)]
    return chunks[:max_chunks]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_clients(client_loop, clients: int) -> float:
    """Run client_loop(0..clients-1) on a thread each, all at once -> wall seconds until the last ends."""
    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class ServerProcess:
    """A `ragkv serve` subprocess on a free loopback port (SIGTERM on stop)."""

    def __init__(self, workdir: Path, memory_budget: int, extra: tuple[str, ...] = ()):
        from kvstore.testing import free_port

        self.port = free_port()
        argv = [sys.executable, "-m", "ragkv.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--store", f"disk:{workdir / 'store'}", "--memory-budget", str(memory_budget),
                "--max-queue", str(4 * CLIENTS), *extra]
        self.stderr = open(workdir / "server.stderr", "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:  # blocks per line; the server prints the ready line once
            if line.startswith("ragkv listening on "):
                return
            if time.monotonic() > deadline:
                break
        raise RuntimeError(f"ragkv serve did not start (rc={self.proc.poll()})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def run(quick: bool = False, progress: bool = True, requests: int | None = None, clients: int = CLIENTS,
        memory_budget: int = MEMORY_BUDGET, max_new_tokens: int = 4, time_limit_s: float = 900.0) -> dict:
    from client import RagKVClient

    n_requests = requests or (32 if quick else 192)
    chunks = corpus(24 if quick else 64)
    with tempfile.TemporaryDirectory(prefix="ragkv-load-") as tmp:
        server = ServerProcess(Path(tmp), memory_budget)
        try:
            server.wait_ready(300)
            target = f"127.0.0.1:{server.port}"
            return _drive(target, server.proc.pid, chunks, n_requests, clients, memory_budget, max_new_tokens,
                          time_limit_s, progress, RagKVClient)
        finally:
            server.stop()


def _drive(target, pid, chunks, n_requests, clients, memory_budget, max_new_tokens, time_limit_s, progress,
           client_cls) -> dict:
    lock = threading.Lock()
    next_index = iter(range(n_requests))
    latencies: dict[str, list[float]] = {"ingest": [], "generate": []}
    errors: list[str] = []
    tier_seen = {"max_bytes_used": 0, "polls": 0, "budget_bytes": None}
    done = threading.Event()
    deadline = time.monotonic() + time_limit_s

    def take() -> int | None:
        with lock:
            return next(next_index, None) if time.monotonic() < deadline else None

    def client_loop(c: int) -> None:
        rng = random.Random(c)
        with client_cls(target, timeout=time_limit_s) as cl:
            while (i := take()) is not None:
                kind = "ingest" if i % 3 == 0 else "generate"
                started = time.perf_counter()
                try:
                    if kind == "ingest":
                        cl.ingest(rng.sample(chunks, 2))
                    else:
                        cl.generate(rng.choice(QUESTIONS), chunks=rng.sample(chunks, 2),
                                    max_new_tokens=max_new_tokens)
                except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                    with lock:
                        errors.append(f"{kind}: {type(e).__name__}: {e}"[:300])
                    continue
                with lock:
                    latencies[kind].append(time.perf_counter() - started)
                    served = sum(len(v) for v in latencies.values())
                if progress and served % 16 == 0:
                    print(f"load: {served}/{n_requests} served, {len(errors)} errors", file=sys.stderr, flush=True)

    def watch_tier() -> None:
        with client_cls(target, timeout=30) as cl:
            while not done.wait(0.2):
                _poll_tier(cl, tier_seen, errors, lock)
            _poll_tier(cl, tier_seen, errors, lock)

    watcher = threading.Thread(target=watch_tier, daemon=True)
    watcher.start()
    wall = run_clients(client_loop, clients)
    done.set()
    watcher.join(60)

    all_lat = latencies["ingest"] + latencies["generate"]
    budget = tier_seen["budget_bytes"]
    return {
        "clients": clients, "requests": n_requests, "served": len(all_lat), "errors": len(errors),
        "error_samples": errors[:5], "wall_s": round(wall, 3),
        "throughput_rps": round(len(all_lat) / wall, 3) if wall else 0.0,
        "latency_s": {"p50": round(percentile(all_lat, 0.5), 4), "p99": round(percentile(all_lat, 0.99), 4),
                      **{kind: {"count": len(v), "p50": round(percentile(v, 0.5), 4),
                                "p99": round(percentile(v, 0.99), 4)} for kind, v in latencies.items()}},
        "server_peak_rss_mb": _peak_rss_mb(pid),
        "memory_tier": {"budget_bytes": budget, "max_bytes_used_seen": tier_seen["max_bytes_used"],
                        "stats_polls": tier_seen["polls"],
                        "exceeded": budget is None or tier_seen["max_bytes_used"] > budget},
        "max_new_tokens": max_new_tokens, "chunks_in_corpus": len(chunks),
    }


def _poll_tier(cl, seen: dict, errors: list, lock) -> None:
    try:
        tier = cl.stats()["engine"]["store"]["backend"]["tier"]
    except Exception as e:  # noqa: BLE001
        with lock:
            errors.append(f"stats: {type(e).__name__}: {e}"[:300])
        return
    seen["polls"] += 1
    seen["budget_bytes"] = tier["budget_bytes"]
    seen["max_bytes_used"] = max(seen["max_bytes_used"], int(tier["bytes_used"]))
