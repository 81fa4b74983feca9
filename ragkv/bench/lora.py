"""`ragkv bench lora`: one shared base chunk cache plus low-rank per-adapter parts, vs a full cache per adapter.

For N = 1, 4, 16 seeded rank-8 adapters (q/k/v/o) over the sample docs:
- full_bytes:   bytes a real BlockStore holds for every adapter's own full chunk blocks;
- shared_bytes: bytes it holds for the base chunk blocks (once) plus every adapter's low-rank block;
- agreement:    fraction of greedy answers (adapter model, blend path) from the reconstructed
                cache equal to those from the adapter's full cache, over the first
                `agreement_adapters` adapters x the sample questions.
Both layouts use the fp16 codec. Also reports reconstruction time and the per-layer KV relative
error of the shared layout vs full for rank 8 and 16 (and of reusing the plain base cache, for scale).
"""

from __future__ import annotations

import json
import statistics
import time
from importlib import resources

from tqdm import tqdm

from kvstore.backends.memory import MemoryBackend
from kvstore.store import BlockStore
from workers.lora import AdapterModels, LoraKVStore, adapter_chunk, random_adapter, relative_error_per_layer
from workers.lora.answer import answer
from workers.prompt import build_prompt

CODEC = "fp16"
COUNTS = (1, 4, 16)


def _samples(runner, quick: bool) -> list[tuple[str, list[int]]]:
    """(question, doc token ids) for each sample question."""
    data = resources.files("ragkv") / "data"
    questions = json.loads((data / "questions.json").read_text())
    out = []
    for q in questions[:1] if quick else questions:
        ids = runner.tokenize((data / "docs" / q["doc"]).read_text())
        out.append((q["question"], ids[:16] if quick else ids))
    return out


def _mean_layers(rows: list[list[float]]) -> list[float]:
    return [round(statistics.mean(col), 5) for col in zip(*rows)]


def run(quick: bool = False, progress: bool = True, rank: int = 8, agreement_adapters: int | None = None,
        max_new_tokens: int | None = None, rel_scale: float = 0.05) -> dict:
    from workers.runner import ModelRunner

    runner = ModelRunner.load("default")
    samples = _samples(runner, quick)
    agreement_adapters = agreement_adapters or (1 if quick else 4)
    max_new_tokens = max_new_tokens or (2 if quick else 12)
    adapters = [random_adapter(runner, rank, seed=i, rel_scale=rel_scale) for i in range(max(COUNTS))]
    # the rank-16 error figure (skipped in quick mode)
    probes = [] if quick else [random_adapter(runner, 16, seed=1000, rel_scale=rel_scale)]
    models = AdapterModels(runner, adapters + probes)
    stores = {n: (LoraKVStore(BlockStore(MemoryBackend(), CODEC, runner.fingerprint), runner),
                  LoraKVStore(BlockStore(MemoryBackend(), CODEC, runner.fingerprint), runner)) for n in COUNTS}
    addresses = {n: ([], []) for n in COUNTS}  # full, shared
    base_kv = [runner.chunk_kv(ids) for _, ids in samples]
    errors = {f"r{a.rank}": {"k": [], "v": [], "k_base": [], "v_base": []} for a in [adapters[0], *probes]}
    agree, changed, t_full, t_shared = [], [], [], []
    base_answers = {}
    bar = tqdm(total=len(adapters) + len(probes), desc="lora bench", disable=not progress)
    for index, adapter in enumerate(adapters + probes):
        adapter_runner = models.runner_for(adapter)
        is_probe = index >= len(adapters)
        for (question, ids), base in zip(samples, base_kv):
            full, parts = adapter_chunk(adapter_runner, adapter, ids)
            for n in COUNTS:
                if not is_probe and index < n:
                    full_store, shared_store = stores[n]
                    addresses[n][0].extend(full_store.put_full(adapter, full))
                    addresses[n][1].extend(shared_store.put_shared(adapter, base, parts))
            if index == 0 or is_probe:
                full_store, shared_store = stores[max(COUNTS)] if not is_probe else stores[1]
                if is_probe:  # the probe is in no N-store: measure through a scratch store
                    shared_store = LoraKVStore(BlockStore(MemoryBackend(), CODEC, runner.fingerprint), runner)
                    shared_store.put_shared(adapter, base, parts)
                rebuilt = shared_store.get_shared(adapter, ids)
                e = errors[f"r{adapter.rank}"]
                k, v = relative_error_per_layer(rebuilt, full)
                kb, vb = relative_error_per_layer(base, full)
                e["k"].append(k), e["v"].append(v), e["k_base"].append(kb), e["v_base"].append(vb)
        if not is_probe and index < agreement_adapters:
            full_store, shared_store = stores[max(COUNTS)]
            for question, ids in samples:
                layout = build_prompt(runner.tokenizer, "", [ids], question)
                t0 = time.perf_counter()
                full = full_store.get_full(adapter, ids)
                t1 = time.perf_counter()
                shared = shared_store.get_shared(adapter, ids)
                t2 = time.perf_counter()
                t_full.append(t1 - t0), t_shared.append(t2 - t1)
                prefix = adapter_runner.chunk_kv(layout.prefix_ids)
                from_full = answer(adapter_runner, layout, prefix, [full], max_new_tokens)
                from_shared = answer(adapter_runner, layout, prefix, [shared], max_new_tokens)
                agree.append((index, from_full == from_shared))
                if question not in base_answers:
                    base_answers[question] = answer(runner, layout, runner.chunk_kv(layout.prefix_ids),
                                                    [full_store.store.get(full_store.base_address(ids), ids)
                                                     or runner.chunk_kv(ids)], max_new_tokens)
                changed.append(from_full != base_answers[question])
        bar.update()
    bar.close()
    out = {"adapters": {}}
    for n in COUNTS:
        full_store, shared_store = stores[n]
        full_bytes = full_store.stored_bytes(addresses[n][0])
        shared_bytes = shared_store.stored_bytes(addresses[n][1])
        hits = [ok for i, ok in agree if i < n]
        out["adapters"][n] = {"full_bytes": full_bytes, "shared_bytes": shared_bytes,
                              "agreement": sum(hits) / len(hits), "shared_over_full": round(shared_bytes / full_bytes, 4),
                              "agreement_answers": len(hits)}
    out.update({
        "codec": CODEC, "rank": rank, "targets": list(adapters[0].targets), "rel_scale": rel_scale,
        "chunks": len(samples), "chunk_tokens": [len(ids) for _, ids in samples],
        "agreement_adapters": min(agreement_adapters, len(adapters)), "max_new_tokens": max_new_tokens,
        "mode": "blend (recompute_ratio 0.15) on the adapter model",
        "adapter_changes_answer": sum(changed) / len(changed),
        "load_s": {"full": statistics.median(t_full), "shared_incl_reconstruct": statistics.median(t_shared)},
        "rel_err_per_layer": {name: {key: _mean_layers(rows) for key, rows in e.items()} for name, e in errors.items()},
    })
    return out


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
