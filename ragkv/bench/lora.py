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

from tqdm import tqdm

from kvstore.backends.memory import MemoryBackend
from kvstore.store import BlockStore
from workers.blend import BlendConfig
from workers.lora import AdapterModels, LoraKVStore, adapter_chunk, random_adapter, relative_error_per_layer
from workers.lora.answer import answer
from workers.prompt import build_prompt
from workers.samples import sample_documents, sample_questions

CODEC = "fp16"
COUNTS = (1, 4, 16)


def _samples(runner, quick: bool) -> list[tuple[str, list[int]]]:
    """(question, doc token ids) for each sample question."""
    docs, questions = sample_documents(), sample_questions()
    out = []
    for q in questions[:1] if quick else questions:
        ids = runner.tokenize(docs[q.doc])
        out.append((q.question, ids[:16] if quick else ids))
    return out


def _mean_layers(rows: list[list[float]]) -> list[float]:
    return [round(statistics.mean(col), 5) for col in zip(*rows)]


def _store(runner) -> LoraKVStore:
    return LoraKVStore(BlockStore(MemoryBackend(), CODEC, runner.fingerprint), runner)


def _error_figure(runner, models, adapter, samples, base_kv) -> dict:
    """Per-layer relative error vs the adapter's full KV, mean over chunks: shared layout, and plain base KV."""
    store, rows = _store(runner), {"k": [], "v": [], "k_base": [], "v_base": []}
    for (_, ids), base in zip(samples, base_kv):
        full, parts = adapter_chunk(models.runner_for(adapter), adapter, ids)
        store.put_shared(adapter, base, parts)
        for prefix, kv in (("", store.get_shared(adapter, ids)), ("_base", base)):
            k, v = relative_error_per_layer(kv, full)
            rows["k" + prefix].append(k), rows["v" + prefix].append(v)
    return {key: _mean_layers(r) for key, r in rows.items()}


def run(quick: bool = False, progress: bool = True, rank: int = 8, agreement_adapters: int | None = None,
        max_new_tokens: int | None = None, rel_scale: float = 0.05) -> dict:
    from workers.runner import ModelRunner

    runner = ModelRunner.load("default")
    samples = _samples(runner, quick)
    agreement_adapters = min(agreement_adapters or (1 if quick else 4), max(COUNTS))
    max_new_tokens = max_new_tokens or (2 if quick else 12)
    adapters = [random_adapter(runner, rank, seed=i, rel_scale=rel_scale) for i in range(max(COUNTS))]
    probes = [] if quick else [random_adapter(runner, 16, seed=1000, rel_scale=rel_scale)]  # rank-16 error figure
    models = AdapterModels(runner, adapters + probes)
    stores = {n: (_store(runner), _store(runner)) for n in COUNTS}  # (full layout, shared layout)
    addresses = {n: ([], []) for n in COUNTS}
    base_kv = [runner.chunk_kv(ids) for _, ids in samples]
    bar = tqdm(total=len(adapters) + agreement_adapters, desc="lora bench", disable=not progress)
    for index, adapter in enumerate(adapters):
        for (_, ids), base in zip(samples, base_kv):
            full, parts = adapter_chunk(models.runner_for(adapter), adapter, ids)
            for n in (n for n in COUNTS if index < n):  # adapter i belongs to every N > i
                addresses[n][0].extend(stores[n][0].put_full(adapter, full))
                addresses[n][1].extend(stores[n][1].put_shared(adapter, base, parts))
        bar.update()

    # answers under the adapter model from its stored full KV, the reconstructed shared KV, and the plain base KV
    full_store, shared_store = stores[max(COUNTS)]
    agree = {"shared": [], "shared_reuse": [], "base_cache": []}
    changed, t_full, t_shared = [], [], []
    base_answers = {}
    for index, adapter in enumerate(adapters[:agreement_adapters]):
        adapter_runner = models.runner_for(adapter)
        for (question, ids), base in zip(samples, base_kv):
            layout = build_prompt(runner.tokenizer, "", [ids], question)
            t0 = time.perf_counter()
            full = full_store.get_full(adapter, ids)
            t1 = time.perf_counter()
            shared = shared_store.get_shared(adapter, ids)
            t_full.append(t1 - t0), t_shared.append(time.perf_counter() - t1)
            prefix = adapter_runner.chunk_kv(layout.prefix_ids)
            reference = answer(adapter_runner, layout, prefix, [full], max_new_tokens)
            reference_reuse = answer(adapter_runner, layout, prefix, [full], max_new_tokens, reuse=True)
            agree["shared"].append((index, answer(adapter_runner, layout, prefix, [shared], max_new_tokens) == reference))
            agree["shared_reuse"].append(
                (index, answer(adapter_runner, layout, prefix, [shared], max_new_tokens, reuse=True) == reference_reuse))
            agree["base_cache"].append((index, answer(adapter_runner, layout, prefix, [base], max_new_tokens) == reference))
            if question not in base_answers:  # the base model's own answer: does the adapter change it?
                base_answers[question] = answer(runner, layout, runner.chunk_kv(layout.prefix_ids), [base],
                                                max_new_tokens)
            changed.append(reference != base_answers[question])
        bar.update()
    bar.close()

    def fraction(kind: str, n: int) -> float:
        hits = [ok for i, ok in agree[kind] if i < n]
        return sum(hits) / len(hits)

    out = {"adapters": {}}
    for n in COUNTS:
        full_bytes = stores[n][0].stored_bytes(addresses[n][0])
        shared_bytes = stores[n][1].stored_bytes(addresses[n][1])
        out["adapters"][n] = {
            "full_bytes": full_bytes, "shared_bytes": shared_bytes, "agreement": fraction("shared", n),
            "shared_over_full": round(shared_bytes / full_bytes, 4),
            "agreement_reuse": fraction("shared_reuse", n), "agreement_base_cache": fraction("base_cache", n),
            "agreement_answers": sum(1 for i, _ in agree["shared"] if i < n)}
    out.update({
        "codec": CODEC, "rank": rank, "targets": list(adapters[0].targets), "rel_scale": rel_scale,
        "chunks": len(samples), "chunk_tokens": [len(ids) for _, ids in samples],
        "agreement_adapters": agreement_adapters, "max_new_tokens": max_new_tokens,
        "mode": f"blend (recompute_ratio {BlendConfig.recompute_ratio}) on the adapter model; *_reuse: plain reuse",
        "adapter_changes_answer": sum(changed) / len(changed),
        "load_s": {"full": statistics.median(t_full), "shared_incl_reconstruct": statistics.median(t_shared)},
        "rel_err_per_layer": {f"r{a.rank}": _error_figure(runner, models, a, samples, base_kv)
                              for a in [adapters[0], *probes]},
    })
    return out


if __name__ == "__main__":
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
