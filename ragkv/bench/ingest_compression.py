"""Chunks compressed at ingest, through the real engine: accuracy, TTFT and bytes against the chunk budget,
alone (fp16 blocks) and with the default codec. Part of `ragkv bench eviction` (its "ingest" rows).

Each pass-key prompt's chunks are ingested once per (codec, budget) into a fresh disk store (budget 1.0 =
stored whole, no compression), then asked by id in blend mode, twice: the first request warms the prefix
and page cache, the second's server-side TTFT is the one reported. `block_bytes_ratio`: stored block bytes
against the uncompressed blocks of the same codec; `kv_bytes_loaded_ratio`: decoded chunk KV loaded.
"""

from __future__ import annotations

import statistics
import tempfile

from kvstore.codecs import DEFAULT_CODEC
from workers.engine import Engine, EngineConfig
from workers.requests import CompressionSpec, GenerateRequest

BUDGETS = (1.0, 0.5, 0.3, 0.2)
POLICY = "kvzip"


def ingest_rows(runner, prompts: list[tuple[list[str], int]], question: str, system_prompt: str,
                max_new_tokens: int, codecs: tuple[str, ...] = ("fp16", DEFAULT_CODEC),
                budgets: tuple[float, ...] = BUDGETS, progress_bar=None) -> list[dict]:
    """prompts: [(chunk texts, pass key)] -> one row per (codec, budget)."""
    rows = []
    for codec in codecs:
        baseline = None
        for budget in budgets:
            spec = None if budget >= 1.0 else CompressionSpec(policy=POLICY, budget=budget)
            found, ttfts, block_bytes, loaded = [], [], 0, 0
            with tempfile.TemporaryDirectory() as tmp:
                engine = Engine(EngineConfig(store=f"disk:{tmp}/blocks", codec=codec, memory_budget_bytes=None,
                                             use_calibration=False), runner=runner)
                for texts, key in prompts:
                    refs = engine.ingest(texts, compression=spec)
                    block_bytes += sum(len(engine.store.get_raw(r.id)) for r in refs)
                    request = GenerateRequest(question=question, chunks=tuple(r.id for r in refs),
                                              system_prompt=system_prompt, mode="blend",
                                              max_new_tokens=max_new_tokens)
                    engine.generate(request)
                    result = engine.generate(request)
                    found.append(str(key) in result.text)
                    ttfts.append(result.ttft_s)
                    loaded += result.stats["kv_bytes_loaded"]
                    if progress_bar is not None:
                        progress_bar.update()
                engine.close()
            if baseline is None:
                baseline = (block_bytes, loaded)
            rows.append({"policy": POLICY if spec else "none", "budget": budget, "codec": codec,
                         "passkey_acc": statistics.fmean(found), "ttft_s": statistics.median(ttfts),
                         "block_bytes_ratio": block_bytes / baseline[0], "kv_bytes_loaded_ratio": loaded / baseline[1]})
    return rows
