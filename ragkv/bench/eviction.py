"""`ragkv bench eviction`: pass-key retrieval, agreement and KL vs the full cache, memory and L1 loss,
for every policy at budgets 0.1 / 0.2 / 0.5, with and without protection of the system prompt.

Each prompt is prefilled once; every (policy, budget, protect) compressor observes that one prefill
(their observers are fanned out), then works on its own copy of the cache, so all rows are measured
side by side on the same activations. Per row and prompt:

- passkey: free greedy decoding with the compressor's decode hooks (the cache stays at budget);
- agreement / KL: teacher-forced on the full cache's greedy output (one forward, no decode-time
  eviction over those few tokens); the first answer token is left out of both, since its logits come
  from the prefill, before any eviction, and are equal for every row;
- kv_bytes_ratio, l1_loss, l1_bound: from `compress()`.

`window_without_sinks` streams a long text through a `streaming` cache with and without the 4
attention sinks (StreamingLLM's collapse) and reports perplexities.
"""

from __future__ import annotations

import math
import random
import statistics

import torch
from tqdm import tqdm

from workers.cache import KVCache, LayerKV
from workers.eviction import POLICIES, make_compressor
from workers.generate import DecodeHooks, SamplingParams, decode
from workers.prompt import build_prompt
from workers.requests import CompressionSpec

BUDGETS = (0.1, 0.2, 0.5)
SYSTEM_PROMPT = ("You are a meticulous research assistant. Read the document carefully, "
                 "find the requested fact and answer with it exactly.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = ("There is a pass key hidden in the text above. What is the pass key? "
            "Reply with the 5-digit number only.")
MAX_NEW_TOKENS = 14  # "The pass key is 12345." (digits are single tokens)


def clone(cache: KVCache) -> KVCache:
    return KVCache([LayerKV(kv.keys.clone(), kv.values.clone(), kv.positions.clone(),
                            None if kv.head_mask is None else kv.head_mask.clone()) for kv in cache.layers])


def passkey_prompt(runner, key: int, depth: float, filler_sentences: int):
    sentences = [FILLER] * filler_sentences
    sentences.insert(int(round(depth * filler_sentences)), NEEDLE.format(key=key))
    chunks = []  # a few chunks, as a RAG request would have
    step = max(1, len(sentences) // 4)
    for i in range(0, len(sentences), step):
        chunks.append(runner.tokenize("".join(sentences[i:i + step]).strip()))
    return build_prompt(runner.tokenizer, SYSTEM_PROMPT, chunks, QUESTION)


def kl_rows(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row. [M, V] logits -> [M]."""
    logp, logq = torch.log_softmax(p_logits.float(), -1), torch.log_softmax(q_logits.float(), -1)
    return (logp.exp() * (logp - logq)).sum(-1)


@torch.inference_mode()
def teacher_forced(runner, cache: KVCache, tokens: list[int], start: int) -> torch.Tensor:
    """Logits predicting tokens[1:] given tokens[:-1] fed at positions start.. -> [len(tokens) - 1, V]."""
    ids = torch.tensor(tokens[:-1])
    return runner.forward(ids, torch.arange(start, start + len(ids)), cache, last_only=False)


def run_prompt(runner, layout, key: int, configs: list[tuple[str, float, bool]], progress_bar) -> dict:
    n = layout.num_tokens
    compressors = {cfg: make_compressor(CompressionSpec(policy=cfg[0], budget=cfg[1], protect_system_prompt=cfg[2]),
                                        runner.shape, layout.prefix_len, n, inv_freq=runner.inv_freq)
                   for cfg in configs}

    def observer(layer, q, q_positions, kv):
        for c in compressors.values():
            c.observer(layer, q, q_positions, kv)

    full = KVCache.empty(runner.shape.num_layers)
    logits = runner.forward(torch.tensor(layout.token_ids), torch.arange(n), full, observer=observer)
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS)
    full_tokens = list(decode(runner, clone(full), logits, n, params))
    out = {"full": {"passkey": str(key) in runner.detokenize(full_tokens)}}
    full_tf = teacher_forced(runner, clone(full), full_tokens, n) if len(full_tokens) > 1 else None
    for cfg, compressor in compressors.items():
        cache = clone(full)
        stats = compressor.compress(cache)
        row = {"kv_bytes_ratio": stats["kv_bytes_ratio"], "l1_loss": stats["l1_loss"], "l1_bound": stats["l1_bound"]}
        if full_tf is not None:
            tf = teacher_forced(runner, clone(cache), full_tokens, n)
            target = torch.tensor(full_tokens[1:])
            row["agreement"] = float((tf.argmax(-1) == target).float().mean())
            row["kl"] = float(kl_rows(full_tf, tf).mean())
        tokens = list(decode(runner, cache, logits, n, params, compressor.decode_hooks()))
        row["passkey"] = str(key) in runner.detokenize(tokens)
        out[cfg] = row
        progress_bar.update()
    return out


@torch.inference_mode()
def stream_perplexity(runner, ids: list[int], budget: int, sink_tokens: int, block: int) -> float:
    """Perplexity of `ids` fed `block` tokens at a time through a streaming cache of `budget` tokens
    (budget=None: the full cache)."""
    cache = KVCache.empty(runner.shape.num_layers)
    hooks = DecodeHooks()
    if budget is not None:
        spec = CompressionSpec(policy="streaming", budget=budget, sink_tokens=sink_tokens, protect_system_prompt=False)
        hooks = make_compressor(spec, runner.shape, 0, budget, inv_freq=runner.inv_freq).decode_hooks()
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, block):
        chunk = ids[start:start + block]
        logits = runner.forward(torch.tensor(chunk), torch.arange(start, start + len(chunk)), cache,
                                observer=hooks.observer, last_only=False)
        targets = ids[start + 1:start + 1 + len(chunk)]
        logp = torch.log_softmax(logits[:len(targets)], -1)
        nll -= float(logp[torch.arange(len(targets)), torch.tensor(targets)].sum())
        count += len(targets)
        if hooks.after_step is not None:
            hooks.after_step(cache)
    return math.exp(nll / count)


def long_text(runner, tokens: int) -> list[int]:
    """Plain English prose shipped with Python (the language reference), `tokens` tokens of it."""
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[name] for name in ("execmodel", "assignment", "import", "comparisons"))
    return runner.tokenize(text)[:tokens]


def window_without_sinks(runner, quick: bool) -> dict:
    num_tokens, budget, block = (400, 48, 8) if quick else (1000, 96, 8)
    ids = long_text(runner, num_tokens)
    return {
        "tokens": len(ids), "budget": budget, "block": block,
        "ppl_full_cache": stream_perplexity(runner, ids, None, 0, block),
        "ppl_with_sinks": stream_perplexity(runner, ids, budget, 4, block),
        "ppl_window_without_sinks": stream_perplexity(runner, ids, budget, 0, block),
    }


def run(quick: bool = False, progress: bool = True, seed: int = 0, threads: int | None = 1) -> dict:
    """threads: torch intra-op threads during the run (restored after). Default 1: eviction bookkeeping is
    many tiny ops, and on a small shared machine 2 threads made them ~100x slower (they wait on each other)."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(quick, progress, seed)
    finally:
        torch.set_num_threads(previous)


def _run(quick: bool, progress: bool, seed: int) -> dict:
    from workers.runner import ModelRunner

    runner = ModelRunner.load()
    rng = random.Random(seed)
    depths = (0.5,) if quick else (0.1, 0.3, 0.5, 0.7, 0.9)
    repeats = 1 if quick else 2
    filler_sentences = 24 if quick else 40  # ~650 / ~1,050 prompt tokens
    configs = [(policy, budget, protect) for policy in sorted(POLICIES) for budget in BUDGETS
               for protect in (True, False)]
    prompts = [(depth, rng.randint(10000, 99999)) for _ in range(repeats) for depth in depths]
    bar = tqdm(total=len(prompts) * len(configs), desc="eviction bench", disable=not progress)
    per_prompt, prompt_tokens = [], []
    for depth, key in prompts:
        layout = passkey_prompt(runner, key, depth, filler_sentences)
        prompt_tokens.append(layout.num_tokens)
        per_prompt.append(run_prompt(runner, layout, key, configs, bar))
    bar.close()

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    full_acc = mean([float(p["full"]["passkey"]) for p in per_prompt])
    results = []
    for cfg in configs:
        rows = [p[cfg] for p in per_prompt]
        results.append({
            "policy": cfg[0], "budget": cfg[1], "protect": cfg[2],
            "passkey_acc": mean([float(r["passkey"]) for r in rows]),
            "agreement_vs_full": mean([r.get("agreement") for r in rows]),
            "kl_vs_full": mean([r.get("kl") for r in rows]),
            "kv_bytes_ratio": mean([r["kv_bytes_ratio"] for r in rows]),
            "l1_loss": mean([r["l1_loss"] for r in rows]),
            "l1_bound": mean([r["l1_bound"] for r in rows]),
        })
    return {
        "full": {"passkey_acc": full_acc},
        "results": results,
        "prompts": len(prompts),
        "prompt_tokens": round(statistics.fmean(prompt_tokens)),
        "window_without_sinks": window_without_sinks(runner, quick),
    }
