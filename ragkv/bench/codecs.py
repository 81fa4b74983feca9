"""`ragkv bench codecs`: size, error and speed of every codec on real KV, side by side with fp16.

Real KV = the default model's keys/values of the shipped sample documents
(workers/data/samples/docs/*.txt, topped up with the repository's own docs to reach the
token target), cut into 256-token chunks, each computed on its own.

Per codec (every registered one, at its default parameters, so pre-RoPE codecs store
their keys un-rotated as a block would):
    bytes_per_token   codec payload bytes per token (all layers, K and V, scales and zeros), before lz4
    ratio_vs_fp16     bytes_per_token / fp16's
    k_rel_err         ||K_hat - K|| / ||K|| over all chunks, keys compared rotated at 0..n-1
                      (v_rel_err: the same for V)
    encode_mb_s       MB of fp16-equivalent KV encoded per second (decode_mb_s: decoded); encoding
                      includes the un-rotation of pre-RoPE codecs
"default" names the serving default (kvstore.codecs.DEFAULT_CODEC, chosen by the quality suite).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch
from tqdm import tqdm

from kvstore.codecs import CODECS, DEFAULT_CODEC, make_codec
from kvstore.kv import ChunkKV

CHUNK_TOKENS = 256
QUICK_TOKENS = 256  # one chunk: the smoke test's budget
FULL_TOKENS = 3072
_ROOT = Path(__file__).resolve().parents[2]


def sample_text() -> str:
    """The sample documents, then a fixed snapshot of the project's own prose (workers/data/samples/
    codec-bench.md: the README's first 8,620 characters as of 2026-12, which the bench read before the README
    became a product page): the same 3,072 tokens as every earlier run, whatever the docs say now."""
    samples = _ROOT / "workers" / "data" / "samples"
    return "\n\n".join(p.read_text() for p in [*sorted((samples / "docs").glob("*.txt")), samples / "codec-bench.md"])


def real_chunks(num_tokens: int, progress: bool = True) -> tuple[list[ChunkKV], str]:
    """Real KV chunks of ~num_tokens tokens in total from the default model; also its fingerprint.

    Cached per process: bench codecs and bench store (and their smoke tests) share one computation.
    """
    chunks, fingerprint = _real_chunks(num_tokens, progress)
    return list(chunks), fingerprint


@functools.lru_cache(maxsize=2)
def _real_chunks(num_tokens: int, progress: bool) -> tuple[tuple[ChunkKV, ...], str]:
    from workers.runner import ModelRunner

    runner = ModelRunner.load("default")
    ids = runner.tokenize(sample_text())
    while len(ids) < num_tokens:  # tiny corpus: repeat rather than invent text
        ids = ids + ids
    ids = ids[:num_tokens]
    spans = [ids[i:i + CHUNK_TOKENS] for i in range(0, len(ids), CHUNK_TOKENS)]
    chunks = [runner.chunk_kv(span) for span in tqdm(spans, desc="chunk KV", disable=not progress)]
    return tuple(chunks), runner.fingerprint


def _timed(fn, reps: int) -> tuple[object, float]:
    best = float("inf")
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def measure(chunks: list[ChunkKV], codecs: dict[str, dict] | None = None, reps: int = 3,
            progress: bool = True) -> dict:
    codecs = codecs or {name: {} for name in CODECS}
    tokens = sum(c.num_tokens for c in chunks)
    fp16_mb = sum(2 * c.keys.numel() * 2 for c in chunks) / 1e6
    fp16_bytes = make_codec("fp16").payload_size(tuple(chunks[0].keys.shape[:2]) + (1, chunks[0].keys.shape[3]))
    results = {}
    for name in tqdm(list(codecs), desc="codecs", disable=not progress):
        codec = make_codec(name, **codecs[name])

        def encode():
            return [codec.encode(s.keys, s.values) for s in (c.with_rope(codec.pre_rope) for c in chunks)]

        payloads, t_enc = _timed(encode, reps)
        decoded, t_dec = _timed(
            lambda: [codec.decode(p, tuple(c.keys.shape), c.keys.dtype) for p, c in zip(payloads, chunks)], reps)
        if codec.pre_rope:  # compare keys in the form every consumer places them: rotated at 0..n-1
            decoded = [(ChunkKV(k, v, c.token_ids, c.inv_freq, pre_rope=True).keys_at(0), v)
                       for (k, v), c in zip(decoded, chunks)]
        k_err = sum(((k - c.keys).float().norm() ** 2).item() for (k, _), c in zip(decoded, chunks))
        v_err = sum(((v - c.values).float().norm() ** 2).item() for (_, v), c in zip(decoded, chunks))
        k_ref = sum((c.keys.float().norm() ** 2).item() for c in chunks)
        v_ref = sum((c.values.float().norm() ** 2).item() for c in chunks)
        bpt = sum(len(p) for p in payloads) / tokens
        results[name] = {
            "bytes_per_token": bpt,
            "ratio_vs_fp16": bpt / fp16_bytes,
            "k_rel_err": (k_err / k_ref) ** 0.5,
            "v_rel_err": (v_err / v_ref) ** 0.5,
            "encode_mb_s": fp16_mb / t_enc,
            "decode_mb_s": fp16_mb / t_dec,
        }
    return {"default": DEFAULT_CODEC, "codecs": results}


def run(quick: bool = False, progress: bool = True) -> dict:
    torch.manual_seed(0)
    chunks, _ = real_chunks(QUICK_TOKENS if quick else FULL_TOKENS, progress=progress)
    return measure(chunks, codecs=model_codecs(), reps=1 if quick else 3, progress=progress)


def model_codecs() -> dict[str, dict]:
    """Every registered codec's params as the default model serves it: `wk4v3` with the model's key plan."""
    from workers.key_plan import codec_for_model
    from workers.runner import ModelRunner

    runner = ModelRunner.load("default")
    return {name: codec_for_model(name, runner).params() for name in CODECS}


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
