"""Chunks compressed at ingest: a query-agnostic policy evicts a chunk's KV once, before it is stored.

A chunk's KV is computed alone, at positions 0..n-1, so a policy whose scores ignore the
question (Policy.query_agnostic: kvzip, capkv) can choose its kept entries once, offline.
The stored chunk then holds only those entries, per layer and head (ChunkKV.positions /
head_mask; the block's positions section), which is less to store, to load and to attend to.

- `compress_chunk(runner, kv, spec)`: the chunk's cache -> Compressor (protection: the chunk's
  first `sink_tokens`) -> a compressed ChunkKV whose `compression` is the spec's address JSON;
- `place_chunk` (workers/blend.py): a compressed chunk put into a fused
  prompt cache at its offset (workers.blend.fuse_chunks): kept entries at their logical positions,
  the rest masked for their heads. Blend may recompute such a token: its fresh K/V land in the heads
  that hold it and stay invisible in the others (head_mask), so dropped entries are never revived;
- `compact(cache)`: after prefill, drop the masked slots so the cache really shrinks.
"""

from __future__ import annotations

import json
from dataclasses import replace

import torch

from kvstore.kv import ChunkKV
from workers.cache import KVCache
from workers.errors import InvalidArgument
from workers.eviction.slots import keep_slots, pack_heads
from workers.requests import CompressionSpec


def check_ingest_spec(spec: CompressionSpec) -> None:
    """InvalidArgument("compression.policy") unless the policy scores without the question."""
    from workers.eviction.policies import POLICIES, build_policy

    if spec.policy == "none":
        return
    if not build_policy(spec).query_agnostic:  # an instance: a wrapper is what its scorer is
        agnostic = ", ".join(sorted(n for n, cls in POLICIES.items() if cls().query_agnostic))
        raise InvalidArgument("compression.policy", f"{spec.policy!r} scores with the question, so it cannot "
                                                    f"compress chunks at ingest; query-agnostic policies: {agnostic}")


@torch.inference_mode()
def compress_chunk(runner, kv: ChunkKV, spec: CompressionSpec) -> tuple[ChunkKV, dict]:
    """kv: one chunk's full KV (post-RoPE, positions 0..n-1) -> (compressed ChunkKV, compressor stats).

    The budget is the spec's over the chunk's tokens (a fraction, at least the sinks; or a token count,
    capped at n)."""
    from workers.eviction import make_compressor

    check_ingest_spec(spec)
    compression = compression_json(spec)  # as asked: the engine derives the address from the same spec
    n = kv.num_tokens
    # a fraction of a short chunk never goes below its sinks (the chunk is kept whole when shorter);
    # a token count below them is the caller's mistake (InvalidArgument from make_compressor)
    budget = min(spec.budget, n) if isinstance(spec.budget, int) else max(spec.budget_tokens(n), min(n, spec.sink_tokens))
    spec = replace(spec, protect_system_prompt=False, protected_spans=(), budget=budget)
    cache = KVCache.from_chunk(kv, device=runner.device, dtype=runner.dtype)
    compressor = make_compressor(spec, runner.shape, prefix_len=0, prompt_len=n,
                                 scale=runner.layers[0].self_attn.scaling, ingest=True)
    compressor.prepare(runner, cache, list(kv.token_ids), (0, n))
    stats = compressor.compress(cache)
    return to_chunk(cache, kv.token_ids, compression, kv.inv_freq), stats


def compression_json(spec: CompressionSpec) -> dict:
    """What the stored bytes depend on: the spec's fields and the policy's parameters (its dataclass
    defaults, e.g. kvzip's head_cap): part of the chunk's address and of its block header."""
    from dataclasses import asdict, is_dataclass

    from workers.eviction.policies import build_policy

    policy = build_policy(spec)
    params = asdict(policy) if is_dataclass(policy) else {}
    return {**spec.address_json(), "params": _jsonable(params)}


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


def to_chunk(cache: KVCache, token_ids: list[int], compression: dict,
             inv_freq: torch.Tensor | None = None) -> ChunkKV:
    """A compressed cache (layers of any layout) -> ChunkKV [L, Hkv, S, D], S = the longest head; `inv_freq`:
    the keys' RoPE frequencies (a pre-RoPE codec un-rotates each kept key by its position with them)."""
    heads = cache.layers[0].keys.shape[0]
    slots = max(kv.num_tokens for kv in cache.layers)
    keys = torch.zeros(len(cache.layers), heads, slots, cache.layers[0].keys.shape[-1], dtype=cache.layers[0].keys.dtype)
    values = torch.zeros_like(keys)
    positions = torch.zeros(keys.shape[:3], dtype=torch.int64)
    head_mask = torch.zeros(keys.shape[:3], dtype=torch.bool)
    for i, kv in enumerate(cache.layers):
        t = kv.num_tokens
        keys[i, :, :t], values[i, :, :t] = kv.keys.cpu(), kv.values.cpu()
        positions[i, :, :t] = kv.head_positions().cpu()
        head_mask[i, :, :t] = True if kv.head_mask is None else kv.head_mask.cpu()
    positions = positions.masked_fill(~head_mask, 0)
    return ChunkKV(keys=keys * head_mask[..., None], values=values * head_mask[..., None], token_ids=list(token_ids),
                   inv_freq=inv_freq, positions=positions, head_mask=head_mask, compression=compression)


def compact(cache: KVCache) -> None:
    """Drop every layer's masked slots (in place): the compressed chunks' dropped entries leave the cache,
    and the heads are packed (bytes = the entries kept, not the longest head)."""
    for i, kv in enumerate(cache.layers):
        if kv.head_mask is not None and not bool(kv.head_mask.all()):
            cache.layers[i] = pack_heads(keep_slots(kv, kv.head_mask)[0])




COMPRESSED_NAMESPACE = "\x00compressed:"  # control characters are reserved for the engine's own namespaces


def chunk_namespace(namespace: str, compression: dict | None) -> str:
    """The namespace a chunk's block is addressed in: the caller's, plus the compression spec when the chunk
    was compressed at ingest (so the spec is part of the content address)."""
    if compression is None:
        return namespace
    return namespace + COMPRESSED_NAMESPACE + json.dumps(compression, sort_keys=True, separators=(",", ":"))


def spec_from_json(compression: dict | None) -> CompressionSpec | None:
    """CompressionSpec.address_json() -> the spec (None stays None)."""
    if compression is None:
        return None
    budget = compression["budget"]
    budget = float(budget) if compression.get("budget_kind") == "float" else int(budget)
    return CompressionSpec(policy=compression["policy"], budget=budget, sink_tokens=int(compression["sink_tokens"]),
                           window=compression.get("window"))
