"""`ragkv bench blend --workload same-docs|zipf`: blend where RAG traffic repeats chunks, with and without
exact reuse of chunk sequences (workers/sequences.py), side by side in one run.

- same-docs: "same documents, another question" through the SDK (a real gRPC server on loopback). Each
  set of 8 documents is asked a first question (blend, as an app would), then a second one; the second is
  measured in `full`, in plain `blend` (a server without the sequence tree) and in `tree+blend`.
- zipf: requests over a pool of ~40 chunks with Zipf popularity, ordered like a retriever's results, so
  popular chunks lead (ragkv/bench/workloads.py). Every request in `full`, `blend` and `tree+blend`.

`full` runs in a namespace of its own, so its exact prefills never feed the tree the others read. Between
requests the bench waits until the server's idle-time queue is empty, as a server with gaps between
requests would (`idle_waits_s` says how long that took). The two engines share the process; an idle one's
scheduler has handed its OpenMP workers back, so the one computing holds the only pool (workers/openmp.py).
"""

from __future__ import annotations

import statistics

from tqdm import tqdm

from ragkv.bench.quality.families import answer_found
from ragkv.bench.workloads import leading_overlap, same_documents, zipf_requests
from workers.requests import GenerateRequest

MODES = ("full", "blend", "tree+blend")
MAX_NEW_TOKENS = 12
IDLE_TIMEOUT_S = 120.0


class Row:
    def __init__(self):
        self.ttft, self.correct, self.agree, self.sequence_chunks = [], 0, 0, []

    def add(self, result, answer: str, full_tokens: list[int]) -> None:
        self.ttft.append(result.ttft_s)
        self.correct += answer_found(answer, result.text)
        self.agree += result.token_ids == full_tokens
        self.sequence_chunks.append(result.stats.get("sequence_chunks", 0))


def _summary(rows: dict[str, Row], count: int, idle: list[float]) -> dict:
    median = {mode: statistics.median(row.ttft) for mode, row in rows.items()}
    return {"queries": count, "ttft_s": median,
            "speedup_vs_full": {mode: median["full"] / median[mode] for mode in rows},
            "speedup_paired": {mode: statistics.median(f / t for f, t in zip(rows["full"].ttft, row.ttft))
                               for mode, row in rows.items()},
            "accuracy": {mode: row.correct / count for mode, row in rows.items()},
            "agreement_vs_full": {mode: row.agree / count for mode, row in rows.items()},
            "sequence_chunks_mean": {mode: statistics.mean(row.sequence_chunks) for mode, row in rows.items()},
            "idle_waits_s": statistics.median(idle) if idle else 0.0}


def same_docs(tree_client, plain_client, tree_engine, count_tokens, count: int, chunk_tokens: int = 122,
              progress: bool = True, max_new_tokens: int = MAX_NEW_TOKENS,
              recompute_ratio: float | None = None) -> dict:
    """`tree_client` / `plain_client`: SDK clients of servers with / without the sequence tree."""
    pairs = same_documents(count, count_tokens, chunk_tokens=chunk_tokens)
    rows, idle = {mode: Row() for mode in MODES}, []
    blend = dict(recompute_ratio=recompute_ratio)  # None: the server's setting
    for first, second in tqdm(pairs, desc="same documents, another question", disable=not progress):
        ask = dict(chunks=list(second.chunks), max_new_tokens=max_new_tokens)
        full = tree_client.generate(second.question, mode="full", namespace="bench-full", **ask)
        for client in (tree_client, plain_client):  # the app's first question over these documents
            client.generate(first.question, chunks=list(first.chunks), max_new_tokens=max_new_tokens, **blend)
        idle.append(tree_engine.scheduler.wait_idle(IDLE_TIMEOUT_S))
        rows["full"].add(full, second.answer, full.token_ids)
        rows["blend"].add(plain_client.generate(second.question, **ask, **blend), second.answer, full.token_ids)
        rows["tree+blend"].add(tree_client.generate(second.question, **ask, **blend), second.answer, full.token_ids)
    return {"workload": "same-docs", "api": "grpc (SDK)", **_summary(rows, len(pairs), idle)}


def zipf(tree_engine, plain_engine, count_tokens, count: int, chunk_tokens: int = 122, progress: bool = True,
         max_new_tokens: int = MAX_NEW_TOKENS, recompute_ratio: float | None = None) -> dict:
    requests = zipf_requests(count, count_tokens, chunk_tokens=chunk_tokens)
    rows, idle = {mode: Row() for mode in MODES}, []
    for request in tqdm(requests, desc="zipf-popular chunks", disable=not progress):
        ask = dict(question=request.question, chunks=request.chunks, max_new_tokens=max_new_tokens)
        blend = dict(recompute_ratio=recompute_ratio)  # None: the engine's setting
        full = tree_engine.generate(GenerateRequest(**ask, mode="full", namespace="bench-full"))
        rows["full"].add(full, request.answer, full.token_ids)
        rows["blend"].add(plain_engine.generate(GenerateRequest(**ask, **blend)), request.answer, full.token_ids)
        rows["tree+blend"].add(tree_engine.generate(GenerateRequest(**ask, **blend)), request.answer, full.token_ids)
        idle.append(tree_engine.scheduler.wait_idle(IDLE_TIMEOUT_S))
    overlap = leading_overlap(requests)
    return {"workload": "zipf", "leading_overlap_mean": statistics.mean(overlap), **_summary(rows, len(requests), idle)}


def run(workload: str, count: int, model: str = "default", codec: str | None = None,
        prefill_kernel: str | None = None, progress: bool = True, chunk_tokens: int = 122,
        max_new_tokens: int = MAX_NEW_TOKENS, recompute_ratio: float | None = None) -> dict:
    """8 chunks of `chunk_tokens` (122: ~1,100-token prompts, the default model's reliable range).
    max_new_tokens, recompute_ratio (None: the engine's setting): smaller runs (the tests)."""
    import tempfile

    from client import RagKVClient
    from ragkv.config import ServeConfig
    from ragkv.server.app import start_server
    from workers.engine import Engine, EngineConfig

    settings = dict(model=model, codec=codec or EngineConfig.codec,
                    prefill_kernel=prefill_kernel or EngineConfig.prefill_kernel)
    with tempfile.TemporaryDirectory(prefix="ragkv-bench-reuse-") as tmp:
        tree = Engine(EngineConfig(store=f"disk:{tmp}/tree", **settings))
        plain = Engine(EngineConfig(store=f"disk:{tmp}/plain", sequence_cache=False, **settings), runner=tree.runner)
        count_tokens = lambda text: len(tree.runner.tokenize(text))  # noqa: E731
        try:
            if workload == "zipf":
                out = zipf(tree, plain, count_tokens, count, chunk_tokens, progress, max_new_tokens, recompute_ratio)
                return {**out, "codec": settings["codec"], "chunk_tokens": chunk_tokens}
            servers = [start_server(ServeConfig(host="127.0.0.1", port=0), engine) for engine in (tree, plain)]
            try:
                with RagKVClient(f"127.0.0.1:{servers[0].port}", timeout=600) as tree_client, \
                        RagKVClient(f"127.0.0.1:{servers[1].port}", timeout=600) as plain_client:
                    out = same_docs(tree_client, plain_client, tree, count_tokens, count, chunk_tokens, progress,
                                    max_new_tokens, recompute_ratio)
            finally:
                for server in servers:
                    server.server.stop(0)
            return {**out, "codec": settings["codec"], "chunk_tokens": chunk_tokens}
        finally:
            plain.close()
            tree.close()
