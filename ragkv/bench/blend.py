"""`ragkv bench blend`: TTFT, accuracy and agreement of every prefill mode on a synthetic RAG set.

All chunks are ingested first (cached), then every query runs in every mode (workers/modes.py)
back to back, so the modes are compared side by side under the same machine load.
"""

from __future__ import annotations

import re
import statistics
import tempfile
from functools import partial

import torch
from tqdm import tqdm

from kvstore.codecs import codec_from_spec
from ragkv.bench.rag_dataset import make_queries
from workers.cache import KVCache
from workers.generate import SamplingParams, decode
from workers.modes import PREFILL_MODES as MODES
from workers.prompt import build_prompt
from workers.requests import GenerateRequest
from workers.rope import rerotate_keys


CODE_RE = re.compile(r"\b\d{5}\b")
ANSWER_TOKENS = 24
QUICK_ANSWER_TOKENS = 8  # --quick (the CI smoke): a 5-digit code is a few tokens


def extract_answer(text: str) -> str:
    """The answer a reader takes away: the first 5-digit code, else the normalized first line."""
    match = CODE_RE.search(text)
    if match:
        return match.group(0)
    lines = text.strip().splitlines()
    return " ".join(lines[0].lower().split()).rstrip(".") if lines else ""


def stored_through(codec, keys: torch.Tensor, values: torch.Tensor,
                   inv_freq: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a store round trip gives back: [L, H, T, D] keys (rotated at 0..T-1) and values encoded and
    decoded by `codec`. A pre-RoPE codec un-rotates the keys with `inv_freq` (required then) before
    quantizing and rotates them back after, as a block and ChunkKV.keys_at do."""
    from kvstore.kv import ChunkKV

    kv = ChunkKV(keys, values, list(range(keys.shape[2])), inv_freq=inv_freq).with_rope(codec.pre_rope)
    k, v = codec.decode(codec.encode(kv.keys, kv.values), tuple(keys.shape), keys.dtype)
    return ChunkKV(k, v, kv.token_ids, inv_freq=inv_freq, pre_rope=codec.pre_rope).keys_at(0), v


@torch.inference_mode()
def codec_only_prefill(runner, layout, round_trip) -> tuple[torch.Tensor, KVCache]:
    """What codec error alone costs: the exact full-prefill KV (every chunk sees its real context), each
    chunk's span round-tripped through the codec as the store would keep it (keys moved back to positions
    0.., quantized, moved to their place again), then the tokens after the last chunk recomputed over it.
    `reuse` on a perfect cache, in effect: no context is missing, every chunk token is decoded from the
    codec. (`blend` can beat it: its recomputed tokens carry exact KV.)
    round_trip(keys, values) -> (keys, values) on [L, H, T, D] stored-form KV: a codec's
    `partial(stored_through, codec)`, or a partial / idealized quantizer (research: ragkv_research.codec_study).
    -> (logits of the last prompt token [1, vocab], cache)."""
    ids = torch.tensor(layout.token_ids, device=runner.device)
    tail = layout.chunk_spans[-1][1] if layout.chunk_spans else layout.prefix_len
    cache = KVCache.empty(runner.shape.num_layers)
    runner.forward(ids[:tail], torch.arange(tail, device=runner.device), cache)
    for start, end in layout.chunk_spans:
        keys = torch.stack([layer.keys[:, start:end] for layer in cache.layers])  # [L, H, T, D]
        values = torch.stack([layer.values[:, start:end] for layer in cache.layers])
        stored_keys = rerotate_keys(keys, -start, runner.inv_freq)
        decoded_keys, decoded_values = round_trip(stored_keys, values)
        decoded_keys = rerotate_keys(decoded_keys, start, runner.inv_freq)
        for i, layer in enumerate(cache.layers):
            layer.keys[:, start:end] = decoded_keys[i]
            layer.values[:, start:end] = decoded_values[i]
    positions = torch.arange(tail, layout.num_tokens, device=runner.device)
    return runner.forward(ids[tail:], positions, cache), cache


def codec_only_text(runner, layout, round_trip, max_new_tokens: int) -> str:
    logits, cache = codec_only_prefill(runner, layout, round_trip)
    return runner.detokenize(list(decode(runner, cache, logits, layout.num_tokens,
                                         SamplingParams(max_new_tokens=max_new_tokens))))


def _generate(engine, query, label: str, setting, max_new_tokens: int):
    """One request; with a `setting` (BlendConfig) it runs as blend with that in place of the engine's."""
    saved = engine.blend_setting
    if setting is not None:
        engine.blend_setting = (setting, "bench")
    try:
        return engine.generate(GenerateRequest(question=query.question, chunks=query.chunks,
                                               mode="blend" if setting is not None else label,
                                               max_new_tokens=max_new_tokens))
    finally:
        engine.blend_setting = saved


def median_parts(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per stage, the median seconds over the requests (0 where a request skipped the stage)."""
    stages = list(dict.fromkeys(stage for row in rows for stage in row))
    return {stage: statistics.median(row.get(stage, 0.0) for row in rows) for stage in stages}


def parse_setting(name: str):
    """`METHOD@RATIO[:shift|:noshift]` (as `blend:METHOD@RATIO` in the quality suite) -> BlendConfig."""
    from ragkv.bench.quality.configs import parse_config

    return parse_config("blend:" + name.removeprefix("blend:")).blend_config()


def run_one(engine, num_chunks: int, chunk_tokens: int, num_queries: int, max_new_tokens: int, seed: int,
            progress: bool = True, settings: dict | None = None) -> dict:
    """`settings`: extra rows, label -> BlendConfig, each run as blend with that setting (side by side)."""
    settings = settings or {}
    labels = [*MODES, *settings]
    count = lambda text: len(engine.runner.tokenize(text))  # noqa: E731
    queries = make_queries(num_queries, num_chunks, chunk_tokens, count, seed=seed)
    ttft = {mode: [] for mode in labels}
    correct = {mode: 0 for mode in labels}
    agree = {mode: 0 for mode in labels}
    prompt_tokens = []
    parts = {mode: [] for mode in labels}  # per query: the request's time breakdown (stage -> seconds)
    fractions = {mode: [] for mode in labels}  # per query: token-layers run / a full prefill's
    round_trip = partial(stored_through, codec_from_spec(engine.config.codec), inv_freq=engine.runner.inv_freq)
    codec_only = {"correct": 0, "agree": 0}
    bar = tqdm(total=len(queries) * (2 + len(labels)), desc=f"blend bench N={num_chunks}", disable=not progress)
    for query in queries:
        engine.ingest(query.chunks)
        bar.update()
        answers = {}
        for mode in labels:
            result = _generate(engine, query, mode, settings.get(mode), max_new_tokens)
            ttft[mode].append(result.ttft_s)
            parts[mode].append(result.stats.get("breakdown", {}))
            fractions[mode].append(result.stats.get("compute_fraction", 1.0))
            answers[mode] = extract_answer(result.text)
            correct[mode] += query.answer in result.text
            bar.update()
        prompt_tokens.append(len(result.prompt_token_ids))
        for mode in labels:
            agree[mode] += answers[mode] == answers["full"]
        layout = build_prompt(engine.runner.tokenizer, "", [engine.runner.tokenize(c) for c in query.chunks],
                              query.question)
        assert layout.token_ids == result.prompt_token_ids, "codec_only must run on the modes' own prompt"
        # on the engine's thread, as all model work: a pool of this thread's would slow the engine (workers/openmp.py)
        text = engine.scheduler.call(lambda: codec_only_text(engine.runner, layout, round_trip, max_new_tokens))
        codec_only["correct"] += query.answer in text
        codec_only["agree"] += extract_answer(text) == answers["full"]
        bar.update()
    bar.close()
    median = {mode: statistics.median(values) for mode, values in ttft.items()}
    return {
        "chunks": num_chunks,
        "chunk_tokens": chunk_tokens,
        "prompt_tokens": round(statistics.mean(prompt_tokens)),
        "ttft_s": median,
        "speedup_vs_full": {mode: median["full"] / median[mode] for mode in labels},
        # the same ratio taken per query, then the median: steadier when the shared box drifts during a run
        "speedup_paired": {mode: statistics.median(f / t for f, t in zip(ttft["full"], ttft[mode])) for mode in labels},
        "accuracy": {mode: correct[mode] / len(queries) for mode in labels},
        "breakdown": {mode: median_parts(parts[mode]) for mode in labels},
        "compute_fraction": {mode: statistics.mean(fractions[mode]) for mode in labels},
        "agreement_vs_full": {mode: agree[mode] / len(queries) for mode in labels},
        "queries": len(queries),
        # exact full-prefill KV stored through the codec, question recomputed: the cost of codec error alone
        "codec_only": {"accuracy": codec_only["correct"] / len(queries),
                       "agreement_vs_full": codec_only["agree"] / len(queries)},
    }


def run(quick: bool = False, progress: bool = True, chunk_counts: tuple[int, ...] | None = None,
        chunk_tokens: int | None = None, num_queries: int | None = None, codec: str | None = None,
        model: str = "default", settings: tuple[str, ...] = (), prefill_kernel: str | None = None,
        workload: str = "synthetic") -> dict:
    """The bench JSON (CONTRACT "Benchmarks", `ragkv bench blend`) for the main setting (8 chunks, or the only one run), plus `runs` for every N.

    `blend` runs the engine's setting for requests without a ratio (the stored calibration, else the default);
    `settings` (`METHOD@RATIO` names) add rows measured side by side, labelled `blend:METHOD@RATIO`.
    codec, prefill_kernel: None = the engine's defaults. `workload`: same-docs / zipf run ragkv/bench/reuse.py."""
    from workers.engine import Engine, EngineConfig

    if workload != "synthetic":
        from ragkv.bench import reuse

        return reuse.run(workload, num_queries or (3 if quick else 10), model, codec, prefill_kernel, progress,
                         **({"chunk_tokens": chunk_tokens} if chunk_tokens else {}))

    codec = codec or EngineConfig.codec
    prefill_kernel = prefill_kernel or EngineConfig.prefill_kernel

    chunk_counts = chunk_counts or ((4,) if quick else (4, 8, 16))
    chunk_tokens = chunk_tokens or (96 if quick else 256)
    num_queries = num_queries or (1 if quick else 20)
    max_new_tokens = QUICK_ANSWER_TOKENS if quick else ANSWER_TOKENS
    with tempfile.TemporaryDirectory(prefix="ragkv-bench-blend-") as tmp:
        # every query runs in every mode over the same chunks: with the sequence tree on, full's exact prefill
        # would serve the others exactly; this bench measures each mode's own path (--workload: with the tree)
        engine = Engine(EngineConfig(model=model, store=f"disk:{tmp}", codec=codec, prefill_kernel=prefill_kernel,
                                     sequence_cache=False))
        try:
            warm = make_queries(1, 2, 32, lambda t: len(engine.runner.tokenize(t)), seed=999)[0]
            for mode in MODES:  # first-call costs (allocator, kernels) stay out of the figures
                engine.generate(GenerateRequest(question=warm.question, chunks=warm.chunks, mode=mode, max_new_tokens=2))
            extra = {f"blend:{parse_setting(s).name}": parse_setting(s) for s in settings}
            runs = [run_one(engine, n, chunk_tokens, num_queries, max_new_tokens, seed=n, progress=progress, settings=extra)
                    for n in chunk_counts]
            setting, source = engine.blend_setting
        finally:
            engine.close()
    main = next((r for r in runs if r["chunks"] == 8), runs[0])
    return {**main, "codec": codec, "prefill_kernel": engine.runner.kernel, "recompute_ratio": setting.recompute_ratio,
            "blend_setting": {"config": setting.name, "source": source, "served_exactly": setting.exact},
            "max_new_tokens": max_new_tokens,
            "agreement_definition": "same extracted answer as full (first 5-digit code, else first line)",
            "runs": runs}
