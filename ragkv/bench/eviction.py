"""`ragkv bench eviction`: pass-key retrieval, system-prompt retention, memory and L1 loss, for every
policy at budgets 0.1 / 0.2 / 0.5, with and without protection of the system prompt.

Two prompt sets of ~1,000 tokens, each laid out as a RAG request (system prompt, retrieved chunks, question):

- pass-key prompts: filler with a 5-digit key at several depths; `passkey_acc` is free greedy decoding with
  the compressor's decode hooks (the cache stays at budget);
- retention prompts: a fictional persona in the system prompt (name, place, years, cat, a greeting to use),
  distractor archive chunks, and a question about the persona. The full cache's answer draws on the system
  prompt (it names the keeper, the lighthouse, greets with "Ahoy"), so `agreement_vs_full` (greedy
  next token equal to the full cache's, teacher-forced on the full cache's answer) and `kl_vs_full`
  (mean KL of next-token distributions) measure how much of the system prompt's effect survives. The
  first answer token is left out of both: its logits come from the prefill, before any eviction.

Each prompt is prefilled once; every (policy, budget, protect) compressor observes that one prefill
(their observers are fanned out) and then works on its own copy of the cache, so all rows are measured
side by side on the same activations. kv_bytes_ratio, l1_loss and l1_bound come from `compress()`,
averaged over both sets.

`window_without_sinks` streams a long text through a `streaming` cache with and without the 4
attention sinks (StreamingLLM's collapse) and reports perplexities.
"""

from __future__ import annotations

import math
import random
import statistics

import torch
from tqdm import tqdm

from kvstore.codecs import DEFAULT_CODEC
from ragkv.bench.divergence import kl_rows, teacher_forced
from ragkv.bench.rag_dataset import NAMES, PLACES, distractor, make_chunk
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
PERSONA = ("You are {name}, keeper of the {place} lighthouse for {years} years. Your cat is called {cat}. "
           "Begin every answer with 'Ahoy' and mention your cat.")
KEEPERS = ("Maren Oddvik", "Tobias Quell", "Ines Farrow", "Ludo Brask", "Petra Saelen", "Amos Vey")
PERSONA_QUESTIONS = ("Who are you and what do you do?", "Tell me about yourself and your cat.",
                     "What is your name and how long have you kept the lighthouse?")
RETENTION_NEW_TOKENS = 24


def clone(cache: KVCache) -> KVCache:
    return KVCache([LayerKV(kv.keys.clone(), kv.values.clone(), kv.positions.clone(),
                            None if kv.head_mask is None else kv.head_mask.clone()) for kv in cache.layers])


def passkey_chunks(key: int, depth: float, filler_sentences: int) -> list[str]:
    """Filler with the needle at `depth`, in a few chunks, as a RAG request would have them."""
    sentences = [FILLER] * filler_sentences
    sentences.insert(int(round(depth * filler_sentences)), NEEDLE.format(key=key))
    step = max(1, len(sentences) // 4)
    return ["".join(sentences[i:i + step]).strip() for i in range(0, len(sentences), step)]


def passkey_prompt(runner, key: int, depth: float, filler_sentences: int):
    chunks = [runner.tokenize(text) for text in passkey_chunks(key, depth, filler_sentences)]
    return build_prompt(runner.tokenizer, SYSTEM_PROMPT, chunks, QUESTION)


def retention_prompt(runner, rng: random.Random, num_chunks: int, chunk_tokens: int):
    """A persona system prompt, distractor archive chunks, a question only the system prompt answers."""
    system_prompt = PERSONA.format(name=rng.choice(KEEPERS), place=rng.choice(PLACES), years=rng.randrange(5, 40),
                                   cat=rng.choice(("Pickle", "Moss", "Biscuit", "Juniper")))
    count = lambda text: len(runner.tokenize(text))  # noqa: E731
    chunks = [runner.tokenize(make_chunk(rng, distractor(rng, rng.choice(NAMES)), count, chunk_tokens))
              for _ in range(num_chunks)]
    return build_prompt(runner.tokenizer, system_prompt, chunks, rng.choice(PERSONA_QUESTIONS))


def observed_prefill(runner, layout, configs: list[tuple[str, float, bool]]):
    """One full prefill observed by a compressor per config. -> (full cache, last logits, compressors)."""
    n = layout.num_tokens
    compressors = {cfg: make_compressor(CompressionSpec(policy=cfg[0], budget=cfg[1], protect_system_prompt=cfg[2]),
                                        runner.shape, layout.prefix_len, n, inv_freq=runner.inv_freq,
                                        question_start=layout.suffix_start)
                   for cfg in configs}

    def observer(layer, q, q_positions, kv):
        for c in compressors.values():
            c.observer(layer, q, q_positions, kv)

    full = KVCache.empty(runner.shape.num_layers)
    logits = runner.forward(torch.tensor(layout.token_ids), torch.arange(n), full, observer=observer)
    scores = None  # kvzip's reconstruction pass depends on the cache only: once per prompt
    for c in compressors.values():
        scores = c.prepare(runner, full, layout.token_ids, (0, layout.suffix_start), scores) or scores
    return full, logits, compressors


def compressed(full: KVCache, compressor) -> tuple[KVCache, dict]:
    cache = clone(full)
    stats = compressor.compress(cache)
    return cache, {key: stats[key] for key in ("kv_bytes_ratio", "l1_loss", "l1_bound")}


def passkey_rows(runner, layout, key: int, configs, progress_bar) -> dict:
    n = layout.num_tokens
    full, logits, compressors = observed_prefill(runner, layout, configs)
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS)
    full_tokens = list(decode(runner, clone(full), logits, n, params))
    out = {"full": {"passkey": str(key) in runner.detokenize(full_tokens)}}
    for cfg, compressor in compressors.items():
        cache, row = compressed(full, compressor)
        tokens = list(decode(runner, cache, logits, n, params, compressor.decode_hooks()))
        row["passkey"] = str(key) in runner.detokenize(tokens)
        out[cfg] = row
        progress_bar.update()
    return out


def retention_rows(runner, layout, configs, progress_bar) -> dict:
    n = layout.num_tokens
    full, logits, compressors = observed_prefill(runner, layout, configs)
    full_tokens = list(decode(runner, clone(full), logits, n, SamplingParams(max_new_tokens=RETENTION_NEW_TOKENS)))
    out = {"full": {"answer": runner.detokenize(full_tokens)}}
    full_tf = teacher_forced(runner, clone(full), full_tokens, n) if len(full_tokens) > 1 else None
    for cfg, compressor in compressors.items():
        cache, row = compressed(full, compressor)
        if full_tf is not None:
            tf = teacher_forced(runner, cache, full_tokens, n)
            row["agreement"] = float((tf.argmax(-1) == torch.tensor(full_tokens[1:])).float().mean())
            row["kl"] = float(kl_rows(full_tf, tf).mean())
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


def protection_effect(results: list[dict]) -> dict:
    """Per budget: mean over policies of agreement / KL with protection and without."""
    effect = {}
    for budget in sorted({r["budget"] for r in results}):
        rows = [r for r in results if r["budget"] == budget and r["agreement_vs_full"] is not None]
        pick = lambda protect, key: statistics.fmean(r[key] for r in rows if r["protect"] == protect)  # noqa: E731
        if rows:
            effect[str(budget)] = {"agreement_with": pick(True, "agreement_vs_full"),
                                   "agreement_without": pick(False, "agreement_vs_full"),
                                   "kl_with": pick(True, "kl_vs_full"), "kl_without": pick(False, "kl_vs_full")}
    return effect


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
    num_retention, retention_chunks = (1, 2) if quick else (10, 4)  # ~550 / ~1,000 prompt tokens
    bar = tqdm(total=(len(prompts) + num_retention) * len(configs), desc="eviction bench", disable=not progress)
    passkey, retention, prompt_tokens, retention_tokens, full_answers = [], [], [], [], []
    for depth, key in prompts:
        layout = passkey_prompt(runner, key, depth, filler_sentences)
        prompt_tokens.append(layout.num_tokens)
        passkey.append(passkey_rows(runner, layout, key, configs, bar))
    for _ in range(num_retention):
        layout = retention_prompt(runner, rng, retention_chunks, 230)
        retention_tokens.append(layout.num_tokens)
        retention.append(retention_rows(runner, layout, configs, bar))
        full_answers.append(retention[-1]["full"]["answer"])
    bar.close()

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    full_acc = mean([float(p["full"]["passkey"]) for p in passkey])
    results = []
    for cfg in configs:
        rows = [p[cfg] for p in passkey + retention]
        results.append({
            "policy": cfg[0], "budget": cfg[1], "protect": cfg[2],
            "passkey_acc": mean([float(p[cfg]["passkey"]) for p in passkey]),
            "agreement_vs_full": mean([p[cfg].get("agreement") for p in retention]),
            "kl_vs_full": mean([p[cfg].get("kl") for p in retention]),
            "kv_bytes_ratio": mean([r["kv_bytes_ratio"] for r in rows]),
            "l1_loss": mean([r["l1_loss"] for r in rows]),
            "l1_bound": mean([r["l1_bound"] for r in rows]),
        })
    return {
        "full": {"passkey_acc": full_acc},
        "results": results,
        "prompts": len(prompts),
        "prompt_tokens": round(statistics.fmean(prompt_tokens)),
        "retention_prompts": num_retention,
        "retention_prompt_tokens": round(statistics.fmean(retention_tokens)),
        "retention_full_answers": full_answers,
        "protection_effect": protection_effect(results),
        "window_without_sinks": window_without_sinks(runner, quick),
        "ingest": ingest_sweep(runner, prompts, filler_sentences, quick, progress),
    }


def ingest_sweep(runner, prompts, filler_sentences: int, quick: bool, progress: bool) -> list[dict]:
    """Chunks compressed at ingest (kvzip) through the engine: accuracy, TTFT, bytes vs the chunk budget."""
    from ragkv.bench.ingest_compression import BUDGETS, ingest_rows

    texts = [(passkey_chunks(key, depth, filler_sentences), key) for depth, key in prompts]
    codecs = ("fp16", DEFAULT_CODEC) if not quick else (DEFAULT_CODEC,)
    budgets = BUDGETS if not quick else (1.0, 0.3)
    bar = tqdm(total=len(texts) * len(codecs) * len(budgets), desc="ingest compression", disable=not progress)
    rows = ingest_rows(runner, texts, QUESTION, SYSTEM_PROMPT, MAX_NEW_TOKENS, codecs, budgets, bar)
    bar.close()
    return rows
