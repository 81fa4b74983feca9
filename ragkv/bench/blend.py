"""`ragkv bench blend`: TTFT, accuracy and agreement of the four modes on a synthetic RAG set.

All chunks are ingested first (cached), then every query runs in all four modes
back to back, so the modes are compared side by side under the same machine load.
"""

from __future__ import annotations

import statistics
import tempfile

from tqdm import tqdm

from ragkv.bench.rag_dataset import make_queries
from workers.requests import MODES, GenerateRequest


def _normalize(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


def run_one(engine, num_chunks: int, chunk_tokens: int, num_queries: int, max_new_tokens: int, seed: int,
            progress: bool = True) -> dict:
    count = lambda text: len(engine.runner.tokenize(text))  # noqa: E731
    queries = make_queries(num_queries, num_chunks, chunk_tokens, count, seed=seed)
    ttft = {mode: [] for mode in MODES}
    correct = {mode: 0 for mode in MODES}
    agree = {mode: 0 for mode in MODES}
    prompt_tokens = []
    bar = tqdm(total=len(queries) * (1 + len(MODES)), desc=f"blend bench N={num_chunks}", disable=not progress)
    for query in queries:
        engine.ingest(query.chunks)
        bar.update()
        answers = {}
        for mode in MODES:
            result = engine.generate(GenerateRequest(question=query.question, chunks=query.chunks, mode=mode,
                                                     max_new_tokens=max_new_tokens))
            ttft[mode].append(result.ttft_s)
            answers[mode] = _normalize(result.text)
            correct[mode] += query.answer in result.text
            bar.update()
        prompt_tokens.append(len(result.prompt_token_ids))
        for mode in MODES:
            agree[mode] += answers[mode] == answers["full"]
    bar.close()
    median = {mode: statistics.median(values) for mode, values in ttft.items()}
    return {
        "chunks": num_chunks,
        "chunk_tokens": chunk_tokens,
        "prompt_tokens": round(statistics.mean(prompt_tokens)),
        "ttft_s": median,
        "speedup_vs_full": {mode: median["full"] / median[mode] for mode in MODES},
        "accuracy": {mode: correct[mode] / len(queries) for mode in MODES},
        "agreement_vs_full": {mode: agree[mode] / len(queries) for mode in MODES},
        "queries": len(queries),
    }


def run(quick: bool = False, progress: bool = True, chunk_counts: tuple[int, ...] | None = None,
        chunk_tokens: int | None = None, num_queries: int | None = None, codec: str = "kivi2",
        model: str = "default") -> dict:
    """CONTRACT JSON for the main setting (8 chunks, or the only one run), plus `runs` for every N."""
    from workers.engine import Engine, EngineConfig

    chunk_counts = chunk_counts or ((4,) if quick else (4, 8, 16))
    chunk_tokens = chunk_tokens or (96 if quick else 256)
    num_queries = num_queries or (2 if quick else 20)
    with tempfile.TemporaryDirectory(prefix="ragkv-bench-blend-") as tmp:
        engine = Engine(EngineConfig(model=model, store=f"disk:{tmp}", codec=codec))
        try:
            warm = make_queries(1, 2, 32, lambda t: len(engine.runner.tokenize(t)), seed=999)[0]
            for mode in MODES:  # first-call costs (allocator, kernels) stay out of the figures
                engine.generate(GenerateRequest(question=warm.question, chunks=warm.chunks, mode=mode, max_new_tokens=2))
            runs = [run_one(engine, n, chunk_tokens, num_queries, 12, seed=n, progress=progress) for n in chunk_counts]
        finally:
            engine.close()
    main = next((r for r in runs if r["chunks"] == 8), runs[0])
    return {**main, "codec": codec, "recompute_ratio": 0.15, "runs": runs}
