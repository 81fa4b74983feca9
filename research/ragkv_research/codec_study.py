"""Which part of a codec's error costs answers (research/codecs.md).

    PYTHONPATH=research python -m ragkv_research.codec_study [--quick] [--json OUT]   (was `ragkv bench codec-study`)

Every variant is scored "codec only" (ragkv.bench.blend.codec_only_prefill): the exact full-prefill KV
of each chunk, round-tripped through the variant as the store would keep it, the question recomputed
over it. No context is missing, so a wrong answer is the quantizer's fault alone. Variants:

- fp16, int4, kivi2: the real codecs;
- kivi2-keys / kivi2-values: kivi2's 2-bit key (per channel) or value (per token) quantization alone,
  the other tensor exact;
- ideal2-keys: an idealized 2-bit key quantizer, exact values. Keys are quantized before RoPE (KVQuant),
  each channel's 32-token group gets its own optimal 4 levels (Lloyd-Max) and keeps its most outlying
  element exact. It costs more bytes than kivi2 may use (4 fp16 levels + one exact value per group);
  it says how far any 2-bit key scheme could get.

Queries are the blend bench's (same generator and seed for a given N), so the figures line up with it.
"""

from __future__ import annotations

import statistics
from functools import partial

import torch
from tqdm import tqdm

from kvstore.codecs import make_codec
from ragkv.bench.blend import codec_only_text, stored_through
from ragkv.bench.rag_dataset import make_queries
from workers.cache import KVCache
from workers.generate import SamplingParams, decode
from workers.prompt import build_prompt
from workers.rope import rerotate_keys

GROUP = 32  # kivi2's group size


def lloyd_max_2bit(x: torch.Tensor, group_size: int = GROUP, exact_per_group: int = 1, iters: int = 10) -> torch.Tensor:
    """x [..., N] -> dequantized [..., N]: groups of `group_size` along the last axis, 4 levels fitted per
    group (nearest level; each level the mean of its members), the `exact_per_group` elements farthest
    from the group median passed through exactly."""
    n = x.shape[-1]
    pad = (-n) % group_size
    groups = torch.nn.functional.pad(x.float(), (0, pad), value=float("nan"))
    groups = groups.reshape(*groups.shape[:-1], -1, group_size)  # [..., G, g]
    valid = ~groups.isnan()
    exact = torch.zeros_like(valid)
    if exact_per_group:
        spread = (groups - groups.nanmedian(dim=-1, keepdim=True).values).abs().nan_to_num(-1.0)
        threshold = spread.topk(exact_per_group, dim=-1).values[..., -1:]
        exact = (spread >= threshold) & valid
    fitted = valid & ~exact
    lo = torch.where(fitted, groups, torch.inf).amin(dim=-1, keepdim=True)
    hi = torch.where(fitted, groups, -torch.inf).amax(dim=-1, keepdim=True)
    levels = lo + (hi - lo) * torch.tensor([0.125, 0.375, 0.625, 0.875])  # [..., G, 4]

    def nearest() -> torch.Tensor:
        return (groups[..., None] - levels[..., None, :]).abs().nan_to_num(torch.inf).argmin(dim=-1)  # [..., G, g]

    for _ in range(iters):
        members = torch.nn.functional.one_hot(nearest(), 4).float() * fitted[..., None]  # [..., G, g, 4]
        count = members.sum(dim=-2)
        total = (members * groups.nan_to_num(0.0)[..., None]).sum(dim=-2)
        levels = torch.where(count > 0, total / count.clamp_min(1), levels)
    out = torch.where(exact, groups, torch.gather(levels, -1, nearest()))
    return out.reshape(*x.shape[:-1], -1)[..., :n].to(x.dtype)


def ideal2_keys(keys: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """keys [L, H, T, D] rotated at 0..T-1: un-rotate, quantize each channel over token groups, rotate back."""
    positions = torch.arange(keys.shape[-2])
    unrotated = rerotate_keys(keys, -positions, inv_freq)
    quantized = lloyd_max_2bit(unrotated.transpose(-1, -2)).transpose(-1, -2)  # groups run along tokens
    return rerotate_keys(quantized, positions, inv_freq)


def variants(inv_freq: torch.Tensor) -> dict:
    """name -> round_trip(keys, values) -> (keys, values), all on stored-form [L, H, T, D] KV."""
    fp16, int4, kivi2 = (partial(stored_through, make_codec(name)) for name in ("fp16", "int4", "kivi2"))
    return {
        "fp16": fp16, "int4": int4, "kivi2": kivi2,
        "kivi2-keys": lambda k, v: (kivi2(k, v)[0], v),  # the real codec, its values thrown away
        "kivi2-values": lambda k, v: (k, kivi2(k, v)[1]),
        "ideal2-keys": lambda k, v: (ideal2_keys(k, inv_freq), v),
    }


def relative_error(x_hat: torch.Tensor, x: torch.Tensor) -> float:
    return float((x_hat.float() - x.float()).norm() / x.float().norm())


def run(quick: bool = False, progress: bool = True, num_chunks: int | None = None, num_queries: int | None = None,
        max_new_tokens: int = 24) -> dict:
    from workers.runner import ModelRunner

    runner = ModelRunner.load()
    num_chunks = num_chunks or (2 if quick else 8)
    num_queries = num_queries or (1 if quick else 6)
    chunk_tokens = 48 if quick else 256
    queries = make_queries(num_queries, num_chunks, chunk_tokens, lambda t: len(runner.tokenize(t)), seed=num_chunks)
    trips = variants(runner.inv_freq)
    correct = {name: 0 for name in ("full", *trips)}
    bar = tqdm(total=len(queries) * (1 + len(trips)), desc="codec study", disable=not progress)
    errors, prompt_tokens = {}, []
    with torch.inference_mode():
        for query in queries:
            layout = build_prompt(runner.tokenizer, "", [runner.tokenize(c) for c in query.chunks], query.question)
            prompt_tokens.append(layout.num_tokens)
            cache = KVCache.empty(runner.shape.num_layers)
            logits = runner.forward(torch.tensor(layout.token_ids), torch.arange(layout.num_tokens), cache)
            full = runner.detokenize(list(decode(runner, cache, logits, layout.num_tokens,
                                                 SamplingParams(max_new_tokens=max_new_tokens))))
            correct["full"] += query.answer in full
            bar.update()
            for name, trip in trips.items():
                text = codec_only_text(runner, layout, trip, max_new_tokens)
                correct[name] += query.answer in text
                bar.update()
            if not errors:  # relative L2 error on the first query's first chunk, stored form
                kv = runner.chunk_kv(runner.tokenize(query.chunks[0]))
                for name, trip in trips.items():
                    keys, values = trip(kv.keys, kv.values)
                    errors[name] = {"keys": relative_error(keys, kv.keys), "values": relative_error(values, kv.values)}
    bar.close()
    return {"chunks": num_chunks, "chunk_tokens": chunk_tokens, "queries": len(queries),
            "prompt_tokens": round(statistics.fmean(prompt_tokens)),
            "codec_only_accuracy": {name: count / len(queries) for name, count in correct.items()},
            "relative_error": errors}


def main() -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small version (the test's)")
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write the result JSON here")
    args = parser.parse_args()
    text = json.dumps(run(quick=args.quick), indent=2)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
