"""Batch precompute: chunk a corpus and store every chunk's KV, fanned out over Ray worker actors.

`run` reads *.txt and *.jsonl (field `text`) under a directory, cuts each document
into token windows (workers/chunking.py), skips chunks whose block is already
stored (so a rerun resumes), computes the rest on N actors that write straight
to the store, and returns a Summary. Under `ray job submit` it joins the job's
cluster; run directly it starts a local one (or joins RAY_ADDRESS). The job's
command line is ragkv/jobs/precompute.py (`python -m ragkv.jobs.precompute`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from workers.chunking import DEFAULT_CHUNK_TOKENS, chunk_text, read_corpus
from workers.engine import EngineConfig

BATCH_CHUNKS = 4  # chunks per actor call: small enough to spread and to lose little to a dead actor


@dataclass
class Summary:
    documents: int = 0
    chunks: int = 0  # chunks in the corpus (after dedup of identical chunks)
    skipped: int = 0  # already stored before dispatch
    computed: int = 0  # computed and written by this run
    waited: int = 0  # found computed by someone else while in flight (single-flight)
    tokens: int = 0  # tokens of the computed chunks
    bytes: int = 0  # block bytes written
    seconds: float = 0.0
    chunks_per_s: float = 0.0
    workers: int = 0
    retries: int = 0


def plan(corpus: str, tokenizer, store, chunk_tokens: int, namespace: str) -> tuple[int, list[list[int]], int]:
    """-> (documents, token lists of the chunks still missing from the store, chunks in total)."""
    documents, seen, missing = 0, set(), []
    for _, text in read_corpus(corpus):
        documents += 1
        for piece in chunk_text(tokenizer, text, chunk_tokens):
            token_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
            address = store.address_for(token_ids, namespace)
            if address in seen:
                continue
            seen.add(address)
            if not store.contains(address):
                missing.append(token_ids)
    return documents, missing, len(seen)


def run(corpus: str, store_url: str, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, codec: str = EngineConfig.codec,
        workers: int | None = None, namespace: str = "", model: str = EngineConfig.model, progress: bool = True,
        pool=None, chunk_form: str = EngineConfig.chunk_form,
        prefill_kernel: str = EngineConfig.prefill_kernel) -> Summary:
    from kvstore.backends.registry import open_backend
    from kvstore.store import BlockStore
    from workers.chunk_forms import chunk_fingerprint
    from workers.key_plan import planned_codec
    from workers.projections import kernel_fingerprint
    from workers.ray_pool import WorkerPool, ensure_ray

    start = time.perf_counter()
    tokenizer, fingerprint = load_tokenizer_and_fingerprint(model)
    store = BlockStore(open_backend(store_url), planned_codec(codec, model), chunk_fingerprint(kernel_fingerprint(fingerprint, prefill_kernel),
                                                                        tokenizer, chunk_form))
    documents, missing, total = plan(corpus, tokenizer, store, chunk_tokens, namespace)
    summary = Summary(documents=documents, chunks=total, skipped=total - len(missing))
    if missing:
        if pool is None:
            ensure_ray("ray")
            pool = WorkerPool(EngineConfig(model=model, store=store_url, codec=codec, memory_budget_bytes=None,
                                           chunk_form=chunk_form, prefill_kernel=prefill_kernel),
                              num_workers=workers)
        summary.workers = len(pool)
        batches = [(missing[i:i + BATCH_CHUNKS], namespace) for i in range(0, len(missing), BATCH_CHUNKS)]
        bar = _progress(len(missing), progress)

        def on_result(_batch, rows) -> None:
            for row in rows:
                if row["outcome"] == "computed":
                    summary.computed += 1
                    summary.tokens += row["num_tokens"]
                    summary.bytes += row["bytes"]
                elif row["outcome"] == "waited":
                    summary.waited += 1
                else:
                    summary.skipped += 1
            bar.update(len(rows))

        pool.map("compute", batches, on_result)
        bar.close()
        summary.retries = pool.retries
    store.close()
    summary.seconds = round(time.perf_counter() - start, 3)
    summary.chunks_per_s = round(summary.computed / summary.seconds, 3) if summary.seconds else 0.0
    return summary


def load_tokenizer_and_fingerprint(model: str):
    """The driver only needs the tokenizer and the model fingerprint (for addresses), not the weights."""
    from transformers import AutoTokenizer

    from workers.model import compute_fingerprint, resolve_model_dir

    model_dir = resolve_model_dir(model)
    return AutoTokenizer.from_pretrained(model_dir), compute_fingerprint(model_dir)


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="chunk", desc="precompute", disable=not enabled, file=sys.stderr)
