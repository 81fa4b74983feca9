"""The prefill pipeline: one request's cache, built from a layout, stored chunks and a typed plan, then run.

    plan = plan_for("blend", setting)                      # workers/modes.py: what runs
    out = run_prefill(runner, layout, plan, source)        # Prefilled: logits, cache, stats

Every path to a first token goes through `run_prefill`: the engine, calibration, `ragkv check`, the
quality suite and `ragkv bench blend`. `source` (a ChunkSource) is where stored KV comes from: the
engine's block store (workers/chunk_source.py), or KV a caller already holds (`HeldChunks`).

    full:            prefill every token
    prefix:          stored prefix block (+ the exact head, below), prefill the rest
    reuse / blend:   stored prefix + exact head + chunks -> fuse (each chunk shifted by the context drift
                     and re-rotated as it is placed, one pass) -> recompute -> logits

The exact head (workers/sequences.py): the KV of the prompt's leading chunks in the same order, stored
from an earlier exact prefill. It is used as it is, like the prefix; only the chunks after it are
re-rotated and blended. Exact reuse first, approximate reuse only where nothing exact is stored.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Iterator, Protocol

import torch

from kvstore.kv import ChunkKV
from workers.blend import BlendConfig, fuse_chunks, recompute, recompute_budget
from workers.cache import KVCache
from workers.chunk_forms import DEFAULT_CHUNK_FORM
from workers.context_drift import context_drift
from workers.eviction.chunks import compact
from workers.modes import PrefillPlan
from workers.prompt import PromptLayout
from workers.sequences import Head


@dataclass(frozen=True)
class Loaded:
    kv: ChunkKV
    hit: bool  # read from the store (False: computed for this request)


class ChunkSource(Protocol):
    """Where a request's stored KV comes from. `degraded`: a store fault was seen while loading."""

    degraded: bool

    def prefix(self, layout: PromptLayout) -> Loaded: ...

    def head(self, layout: PromptLayout) -> Head: ...  # the stored exact KV of the leading chunks, if any

    def chunks(self, layout: PromptLayout, first: int = 0) -> list[Loaded]: ...  # chunks first.. of the layout


@dataclass
class HeldChunks:
    """KV the caller already holds (calibration, `ragkv check`, the quality suite): every read is a hit."""

    prefix_kv: ChunkKV
    chunk_kvs: list[ChunkKV] = field(default_factory=list)
    degraded: bool = False

    def prefix(self, layout: PromptLayout) -> Loaded:
        return Loaded(self.prefix_kv, True)

    def head(self, layout: PromptLayout) -> Head:
        return Head(end=layout.prefix_len)

    def chunks(self, layout: PromptLayout, first: int = 0) -> list[Loaded]:
        return [Loaded(kv, True) for kv in self.chunk_kvs[first:]]


STAGES = ("load", "shift", "fuse", "layers", "logits")  # the breakdown's parts, in pipeline order


@dataclass
class PrefillStats:
    """What one prefill did; `as_dict()` is the flat stats JSON of GenerateResult (CONTRACT names)."""

    mode: str
    prompt_tokens: int
    recomputed_tokens: int = 0  # stored chunk tokens recomputed (blend) or tokens prefilled (full, prefix)
    always_computed_tokens: int = 0
    chunks_hit: int = 0
    chunks_computed: int = 0
    kv_bytes_loaded: int = 0
    prefix_hit: bool = False
    degraded: bool = False
    compressed_chunks: int = 0
    sequence_chunks: int = 0  # leading chunks served exactly from the sequence tree (workers/sequences.py)
    compute_fraction: float = 1.0  # token-layers run / a full prefill's (a deterministic cost)
    context_drift: bool = False
    blend_method: str | None = None  # the selection method; "reuse" when nothing is recomputed, "exact" when
    # the blend setting was served by an exact prefill (BlendConfig.exact)
    blend_config: str | None = None  # METHOD@RATIO that ran (per chunk kind)
    recompute_ratio: float | None = None
    check_layer: int | None = None
    breakdown: dict[str, float] = field(default_factory=dict)  # stage -> seconds (STAGES)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Prefilled:
    logits: torch.Tensor  # [1, vocab] fp32, the last prompt token's
    cache: KVCache  # the whole prompt's KV, ready for decode
    stats: PrefillStats


class Stopwatch:
    """Seconds per stage, added up (a stage may run more than once)."""

    def __init__(self, into: dict[str, float]):
        self.into = into

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.into[name] = self.into.get(name, 0.0) + time.perf_counter() - start


def kv_nbytes(kv: ChunkKV) -> int:
    return kv.keys.nbytes + kv.values.nbytes


@torch.inference_mode()
def run_prefill(runner, layout: PromptLayout, plan: PrefillPlan, source: ChunkSource | None = None,
                chunk_form: str = DEFAULT_CHUNK_FORM, observer=None) -> Prefilled:
    """Fill a KVCache for the whole prompt by `plan` and return the last token's logits with the stats.
    `source` is needed by plans that read stored KV; `chunk_form` names the model's context drift."""
    stats = PrefillStats(plan.mode, layout.num_tokens)
    watch = Stopwatch(stats.breakdown)
    if not plan.stored_chunks:
        cache, start = KVCache.empty(runner.shape.num_layers), 0
        if plan.stored_prefix:
            with watch.stage("load"):
                prefix = _joined(_count_prefix(source.prefix(layout), stats), _count_head(source.head(layout), stats))
                cache, start = KVCache.from_chunk(prefix, device=runner.device, dtype=runner.dtype), prefix.num_tokens
        stats.recomputed_tokens = layout.num_tokens - start
        stats.compute_fraction = stats.recomputed_tokens / layout.num_tokens
        ids = torch.tensor(layout.token_ids[start:], device=runner.device)
        with watch.stage("layers"):
            logits = runner.forward(ids, torch.arange(start, layout.num_tokens, device=runner.device), cache,
                                    observer=observer)
        if plan.exact_for is not None:  # a blend setting served exactly (BlendConfig.exact)
            stats.blend_method, stats.blend_config = "exact", plan.exact_for.name
            stats.recompute_ratio = plan.exact_for.recompute_ratio
        return Prefilled(logits, cache, stats)
    with watch.stage("load"):
        head = source.head(layout)
        prefix = _count_prefix(source.prefix(layout), stats)
        nodes = _count_head(head, stats)
        chunks = _count_chunks(source.chunks(layout, head.chunks), stats)
        stats.degraded = source.degraded
    rest = _after(layout, head)  # the prompt as blend sees it: the exact head is its prefix
    compressed = stats.compressed_chunks > 0
    config = None if plan.blend is None else plan.blend.for_prompt(compressed)
    budget = recompute_budget(config, sum(end - start for start, end in rest.chunk_spans))  # of the stored chunk tokens
    drift = None
    if rest.chunk_spans and _shifts(plan, config, budget, compressed):
        with watch.stage("shift"):  # the model's drift (measured once); added as each chunk is placed
            drift = context_drift(runner, chunk_form)
            stats.context_drift = True
    with watch.stage("fuse"):  # after an exact head, no chunk is the prompt's first
        cache, computed = fuse_chunks(runner, rest, prefix, chunks, nodes, drift, first=not head.chunks)
    with watch.stage("layers"):
        done = recompute(runner, rest, cache, computed, config, observer=observer)
    with watch.stage("logits"):
        logits = runner.logits(done.hidden)
    if compressed:
        compact(cache)  # the compressed chunks' dropped entries leave the cache
    _count_blend(stats, done, config, runner.shape.num_layers)
    return Prefilled(logits, cache, stats)


def _shifts(plan: PrefillPlan, config: BlendConfig | None, budget: int, compressed: bool) -> bool:
    """The plan's own word, else the blend setting's: shift when something is recomputed, or over chunks
    compressed at ingest (where nothing is recomputed by default); plain reuse never."""
    if plan.shift is not None:
        return plan.shift
    return config is not None and config.context_drift and (budget > 0 or compressed)


def _after(layout: PromptLayout, head: Head) -> PromptLayout:
    """`layout` with its exact head as the prefix: the chunks after it are the ones stored KV is placed for."""
    if not head.chunks:
        return layout
    return replace(layout, prefix_len=head.end, chunk_spans=layout.chunk_spans[head.chunks:])


def _count_head(head: Head, stats: PrefillStats) -> list[ChunkKV]:
    stats.sequence_chunks = head.chunks
    stats.chunks_hit += head.chunks  # served from the store, exactly
    stats.kv_bytes_loaded += sum(kv_nbytes(kv) for kv in head.nodes)
    return head.nodes


def _joined(prefix: ChunkKV, nodes: list[ChunkKV]) -> ChunkKV:
    """The system-prompt prefix followed by the head's nodes as one exact ChunkKV at positions 0..end-1 (for
    `prefix` mode's cache; every key is already at its real position, so placing it at 0 rotates nothing)."""
    if not nodes:
        return prefix
    dtype = prefix.keys.dtype
    keys = torch.cat([prefix.keys, *(kv.keys.to(prefix.keys.device, dtype) for kv in nodes)], dim=2)
    values = torch.cat([prefix.values, *(kv.values.to(prefix.values.device, dtype) for kv in nodes)], dim=2)
    token_ids = list(prefix.token_ids) + [t for kv in nodes for t in kv.token_ids]
    return ChunkKV(keys, values, token_ids)


def _count_prefix(loaded: Loaded, stats: PrefillStats) -> ChunkKV:
    stats.prefix_hit = loaded.hit
    stats.kv_bytes_loaded += kv_nbytes(loaded.kv) if loaded.hit else 0
    return loaded.kv


def _count_chunks(loaded: list[Loaded], stats: PrefillStats) -> list[ChunkKV]:
    for item in loaded:
        stats.chunks_hit += item.hit
        stats.chunks_computed += not item.hit
        stats.kv_bytes_loaded += kv_nbytes(item.kv) if item.hit else 0
        stats.compressed_chunks += item.kv.positions is not None
    return [item.kv for item in loaded]


def _count_blend(stats: PrefillStats, done, config: BlendConfig | None, num_layers: int) -> None:
    stats.recomputed_tokens = done.recomputed_tokens
    stats.always_computed_tokens = done.always_computed_tokens
    stats.compute_fraction = done.token_layers / (stats.prompt_tokens * num_layers)
    if config is None:
        stats.blend_method, stats.recompute_ratio = ("shift" if stats.context_drift else "reuse"), 0.0
        return
    stats.blend_method, stats.blend_config = config.method, config.name
    stats.recompute_ratio, stats.check_layer = config.recompute_ratio, config.check_layer
