"""`ragkv bench precompute`: batch precompute throughput over Ray actors, and the Ray path's overhead.

In one run, on a redis-server started for it and a local Ray:
    workers.{1,2}.chunks_per_s   precompute of the same synthetic corpus (flushed between runs)
                                 with 1 and then 2 worker actors; `scaling` = 2-worker / 1-worker rate
    overhead.inproc_s / ray_s    one blend request over already-stored chunks: Engine.generate in this
                                 process vs RayEngine.generate (actor call, pickling, result back);
                                 median of a few repeats, `overhead_s` = ray - inproc
Each actor holds its own copy of the model; on a CPU-only host the actors share the cores,
so scaling is bounded by the core count, not by Ray.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

WORDS = ("river valley glacier protein enzyme orbit comet ledger invoice harbor lantern meadow copper "
         "violin archive passkey signal thunder granite velvet").split()


def _corpus(root: Path, docs: int, words: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for d in range(docs):
        text = " ".join(f"{WORDS[(d * 7 + i * 3) % len(WORDS)]}{(d * 31 + i) % 97}" for i in range(words))
        (root / f"doc{d}.txt").write_text(text + ".")
    return root


def run(quick: bool = False, progress: bool = True) -> dict:
    import ray
    import redis

    from kvstore.testing import RedisServer
    from workers import precompute
    from workers.engine import Engine, EngineConfig
    from workers.ray_pool import RayEngine, WorkerPool
    from workers.requests import GenerateRequest

    docs, words, chunk_tokens, repeats = (4, 200, 64, 3) if quick else (8, 400, 128, 5)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")
    import torch

    out: dict = {"chunk_tokens": chunk_tokens, "cpus": os.cpu_count(), "driver_torch_threads": torch.get_num_threads(),
                 "workers": {}}
    try:
        corpus = _corpus(Path(tmp) / "corpus", docs, words)
        with RedisServer() as server:
            ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp + "/r", ignore_reinit_error=True)
            config = EngineConfig(store=server.url, memory_budget_bytes=None)
            pool = None
            for n in (1, 2):
                if pool is not None:
                    pool.shutdown()
                pool = WorkerPool(config, num_workers=n)
                redis.Redis.from_url(server.url).flushdb()
                s = precompute.run(str(corpus), server.url, chunk_tokens=chunk_tokens, progress=progress, pool=pool)
                out["workers"][n] = {"chunks": s.chunks, "tokens": s.tokens, "seconds": s.seconds,
                                     "chunks_per_s": s.chunks_per_s, "bytes": s.bytes}
            r1, r2 = out["workers"][1]["chunks_per_s"], out["workers"][2]["chunks_per_s"]
            out["scaling_2_vs_1"] = round(r2 / r1, 3) if r1 else None

            from workers.chunking import chunk_text
            from workers.precompute import load_tokenizer_and_fingerprint

            tokenizer, _ = load_tokenizer_and_fingerprint(config.model)
            texts = chunk_text(tokenizer, (corpus / "doc0.txt").read_text(), chunk_tokens)[:2]  # stored chunks
            request = GenerateRequest(question="Which words repeat?", chunks=tuple(texts), max_new_tokens=8)
            inproc = Engine(EngineConfig(store=server.url))
            remote = RayEngine(replace_workers(config), pool)
            inproc.generate(request), remote.generate(request)  # warm: chunks stored, prefix cached
            t_in, t_ray = [], []
            for _ in range(repeats):
                t0 = time.perf_counter(); inproc.generate(request); t_in.append(time.perf_counter() - t0)
                t0 = time.perf_counter(); remote.generate(request); t_ray.append(time.perf_counter() - t0)
            out["overhead"] = {"inproc_s": round(statistics.median(t_in), 4), "ray_s": round(statistics.median(t_ray), 4),
                               "overhead_s": round(statistics.median(t_ray) - statistics.median(t_in), 4),
                               "repeats": repeats, "max_new_tokens": 8}
            pool.shutdown()
            ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def replace_workers(config):
    from dataclasses import replace

    return replace(config, workers="ray")
