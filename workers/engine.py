"""Engine: ingest chunks and answer requests in every prefill mode (workers/modes.py), over a block store and a model runner.

It only orchestrates; the math lives in blend.py, rope.py, eviction/ and the runner.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import torch

from kvstore.backends.base import Backend, StoreFullError
from kvstore.backends.memory import MemoryTier
from kvstore.backends.registry import open_backend
from kvstore.codecs import DEFAULT_CODEC
from kvstore.kv import ChunkKV
from kvstore.store import BlockStore
from workers.allocator import retain_freed_memory
from workers.batching.scheduler import BatchConfig, Scheduler
from workers.batching.sequence import Sequence
from workers.batching.step import decode_step
from workers.blend import BlendConfig, blend_prefill, fuse_chunks
from workers.cache import KVCache
from workers.chunk_forms import DEFAULT_CHUNK_FORM, chunk_fingerprint, compute_chunk
from workers.context_drift import drift_for
from workers.errors import Cancelled, InvalidArgument, NotFound, Unavailable
from workers.eviction.chunks import (check_ingest_spec, chunk_namespace, compact, compress_chunk, compression_json,
                                     spec_from_json)
from workers.generate import DecodeHooks, SamplingParams
from workers.key_plan import codec_for_model
from workers.modes import PREFILL_MODES, PrefillContext, kv_nbytes
from workers.paths import default_store_url
from workers.projections import DEFAULT_PREFILL_KERNEL
from workers.prompt import PromptLayout, build_prompt
from workers.requests import ChunkRef, CompressionSpec, GenerateRequest, GenerateResult, is_chunk_id
from workers.runner import ModelRunner
from workers.stats import EngineCounters, EngineStats, ModelInfo

if TYPE_CHECKING:
    from workers.protocol import ChunkCompute

log = logging.getLogger("ragkv.engine")

PREFIX_CODEC = "fp16"  # the system-prompt prefix is reused as an exact prefix: keep it near-lossless
# prefix blocks never collide with chunk blocks of the same tokens. ":alone": a prefix is computed as what it
# is, the start of the prompt; before 2026-12-02 the engine computed it in the chunk form (`lead`: after a
# second copy of the template), and those blocks, wrong KV, must not be found
PREFIX_NAMESPACE = "\x00prefix:alone"
PREFIX_FORM = "alone"
MAX_CHUNK_TOKENS = 4096


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"
    store: str | None = None  # disk:PATH | redis://HOST:PORT/DB; None = disk under the cache dir
    codec: str = DEFAULT_CODEC  # chosen by the quality suite (kvstore/codecs/__init__.py, README "Codecs")
    device: str | None = None
    memory_budget_bytes: int | None = 256 << 20  # in-memory tier in front of the store; None/0 = off
    store_budget_bytes: int | None = None
    workers: str = "inproc"
    blend: BlendConfig = field(default_factory=BlendConfig)
    chunk_form: str = DEFAULT_CHUNK_FORM  # how a chunk's stored KV is computed (workers/chunk_forms.py)
    use_calibration: bool = True  # a stored calibration replaces `blend` for requests without a ratio
    batch: BatchConfig = field(default_factory=BatchConfig)  # continuous batching (workers/batching)
    prefill_kernel: str = DEFAULT_PREFILL_KERNEL  # the prefill's projections (workers/projections.py)
    retain_memory: bool = True  # keep freed host memory for the next request (workers/allocator.py)


def open_store_backend(config: EngineConfig) -> Backend:
    """The configured backend, behind an in-memory tier when it has a budget."""
    backend = open_backend(config.store or default_store_url(), budget_bytes=config.store_budget_bytes)
    if config.memory_budget_bytes:
        backend = MemoryTier(backend, config.memory_budget_bytes)
    return backend


class Engine:
    """The in-process engine (workers/protocol.py: EngineProtocol).

    `chunk_compute` is where a chunk missing from the store gets computed: None = here, in this
    process; a ChunkCompute (the Ray WorkerPool) writes the block to the shared store, and the
    engine reads it back (or computes it here if that fails)."""

    def __init__(self, config: EngineConfig, runner: ModelRunner | None = None,
                 chunk_compute: ChunkCompute | None = None):
        self.config = config
        if config.retain_memory:  # before the scheduler's thread starts (it keeps its first arena)
            retain_freed_memory()
        self.runner = (runner or ModelRunner.load(config.model, device=config.device)).with_kernel(config.prefill_kernel)
        backend = open_store_backend(config)
        # decoded blocks land on the model's device: payload copied once, dequantized there (Triton on CUDA)
        # the chunk form is part of what a chunk block is addressed and verified by
        fingerprint = chunk_fingerprint(self.runner.kv_fingerprint, self.runner.tokenizer, config.chunk_form)
        self.store = BlockStore(backend, codec_for_model(config.codec, self.runner), fingerprint, device=self.runner.device)
        shape = self.runner.shape  # a codec that cannot hold this model's KV is refused now, not at the first chunk
        self.store.codec.payload_size((shape.num_layers, shape.num_kv_heads, 1, shape.head_dim))
        # same backend, own codec: the codec is part of the address, so the two never collide
        self.prefix_store = BlockStore(backend, PREFIX_CODEC, self.runner.kv_fingerprint)
        self.blend_setting = blend_setting(config, self.runner)  # (config, "calibrated" | "default")
        # the model's context drift (workers/context_drift.py), read or measured now rather than at a request:
        # the `shift` mode needs it whatever the blend setting says (blend_prefill applies the setting's rule)
        self.drift = drift_for(self.runner, self.blend_setting[0], config.chunk_form, shift=True)
        self._prefix_cache: OrderedDict[str, ChunkKV] = OrderedDict()
        self.counters = EngineCounters()
        self.chunk_compute = chunk_compute
        self.decode_weights = self.runner.decode_weights(config.batch.decode_kernel, config.batch.max_batch)
        # continuous batching: the scheduler's one thread runs all model work (prefill, decode, ingest compute)
        self.scheduler = Scheduler(config.batch, self._start_sequence, self._decode_sequences)

    # -- chunks ---------------------------------------------------------------
    def tokenize_chunk(self, text: str, field_name: str) -> list[int]:
        """A chunk's token ids; InvalidArgument(field_name) when it has none or too many."""
        token_ids = self.runner.tokenize(text)
        if not token_ids:
            raise InvalidArgument(field_name, "has no tokens")
        if len(token_ids) > MAX_CHUNK_TOKENS:
            raise InvalidArgument(field_name, f"{len(token_ids)} tokens, over the limit of {MAX_CHUNK_TOKENS}")
        return token_ids

    def _load_or_compute(self, store, token_ids: list[int], namespace: str, pin: bool = False,
                         compression: CompressionSpec | None = None, form: str | None = None) -> tuple[ChunkKV, bool]:
        """(kv, was_hit); runs on the scheduler's thread. A store fault is a miss: compute, store if it takes it.

        `compression`: the chunk is stored compressed to that spec (its namespace must be chunk_namespace's).
        `form`: how a miss is computed (workers/chunk_forms.py); None = the engine's chunk form."""
        address = store.address_for(token_ids, namespace)
        kv = store.get(address, token_ids)
        if kv is not None:
            if pin:
                store.pin(address)
            return kv, True
        if self.chunk_compute is not None and store is self.store and compression is None:  # it writes the block
            self.chunk_compute.compute([token_ids], namespace, pin)
            kv = store.get(address, token_ids)
            if kv is not None:
                return kv, False
        kv = compute_chunk(self.runner, token_ids, form or self.config.chunk_form)
        if compression is not None:
            kv, _ = compress_chunk(self.runner, kv, compression)
        data, kv = store.as_stored(kv)
        try:
            if store.put_raw(address, data) and pin:
                store.pin(address)
        except StoreFullError as exc:  # pinned blocks fill the budget: answer anyway, uncached
            log.warning("chunk %s not stored: %s", address[:16], exc)
        return kv, False

    def ingest(self, texts: Sequence[str], pin: bool = False, namespace: str = "",
               compression: CompressionSpec | None = None) -> list[ChunkRef]:
        """`compression` (a query-agnostic policy): each chunk is stored already compressed to that budget,
        under an address that includes the spec; InvalidArgument("compression.policy") otherwise."""
        if not texts:
            raise InvalidArgument("chunks", "at least one chunk is required")
        if compression is not None and compression.policy == "none":
            compression = None
        if compression is not None:
            check_ingest_spec(compression)
        block_namespace = chunk_namespace(namespace, None if compression is None else compression_json(compression))
        token_lists = [self.tokenize_chunk(text, f"chunks[{i}]") for i, text in enumerate(texts)]
        refs = []
        for token_ids in token_lists:
            address = self.store.address_for(token_ids, block_namespace)
            # a verified header, not mere existence: a damaged or old-format block is dropped and recomputed
            header = self.store.get_header(address)
            cached = header is not None and list(header.token_ids) == token_ids
            if cached:
                if pin:
                    self.store.pin(address)
            else:  # on the scheduler's thread, between two steps: all model work runs there
                self.scheduler.call(lambda ids=token_ids: self._load_or_compute(
                    self.store, ids, block_namespace, pin=pin, compression=compression))
                self.counters.ingested += 1
            refs.append(ChunkRef(id=address, num_tokens=len(token_ids), cached=cached))
        return refs

    def compute_block(self, token_ids: list[int]) -> bytes:
        """One chunk's block bytes, computed in this process on the scheduler's thread (not stored)."""
        return self.scheduler.call(
            lambda: self.store.encode(compute_chunk(self.runner, token_ids, self.config.chunk_form)))

    def _resolve_chunk(self, chunk: str, index: int, namespace: str) -> tuple[list[int], dict | None]:
        """-> (token ids, the compression the stored chunk was ingested with, or None)."""
        if not is_chunk_id(chunk):
            return self.tokenize_chunk(chunk, f"chunks[{index}]"), None
        header = self._owned_header(chunk, namespace)
        if header is None and self.store.degraded:
            raise Unavailable(f"chunks[{index}]: the store is unavailable and the chunk was given by id only")
        if header is None:
            raise NotFound(f"chunks[{index}]: no stored chunk with id {chunk}")
        return list(header.token_ids), header.compression

    def _owned_header(self, chunk_id: str, namespace: str):
        """The stored block's header if `chunk_id` is the address of its tokens in `namespace`, else None.

        An id names a block, not a namespace: re-deriving the address from the block's own token
        ids and the caller's namespace keeps one namespace's blocks invisible to every other."""
        if not is_chunk_id(chunk_id):
            return None
        header = self.store.get_header(chunk_id)
        if header is None or self.store.address_for(header.token_ids,
                                                    chunk_namespace(namespace, header.compression)) != chunk_id:
            return None
        return header

    def _prefix_kv(self, layout: PromptLayout) -> tuple[ChunkKV, bool]:
        address = self.prefix_store.address_for(layout.prefix_ids, PREFIX_NAMESPACE)
        if address in self._prefix_cache:
            self._prefix_cache.move_to_end(address)
            return self._prefix_cache[address], True
        kv, hit = self._load_or_compute(self.prefix_store, layout.prefix_ids, PREFIX_NAMESPACE, pin=True,
                                        form=PREFIX_FORM)  # the prompt's real start: no lead-in before it
        self._prefix_cache[address] = kv
        while len(self._prefix_cache) > 16:
            self._prefix_cache.popitem(last=False)
        return kv, hit

    # -- generation -------------------------------------------------------------
    def generate(self, request: GenerateRequest, should_stop: Callable[[], bool] | None = None) -> GenerateResult:
        result = None
        for item in self.generate_stream(request, should_stop):
            if isinstance(item, GenerateResult):
                result = item
        assert result is not None
        return result

    def generate_stream(self, request: GenerateRequest,
                        should_stop: Callable[[], bool] | None = None) -> Iterator[str | GenerateResult]:
        """Yield text pieces as tokens are generated, then one GenerateResult.

        The prompt is resolved here, in the caller's thread (a bad chunk fails at once); the prefill
        and every decode step run on the scheduler's thread, batched with the other requests."""
        start = time.perf_counter()
        resolved = [self._resolve_chunk(c, i, request.namespace) for i, c in enumerate(request.chunks)]
        layout = build_prompt(self.runner.tokenizer, request.system_prompt, [ids for ids, _ in resolved],
                              request.question)
        params = SamplingParams(request.max_new_tokens, request.temperature, request.top_p, request.seed)
        seq = Sequence(request, params, should_stop or (lambda: False),
                       kv_tokens=layout.num_tokens + request.max_new_tokens,
                       context={"start": start, "layout": layout, "compressions": [c for _, c in resolved]})
        self.scheduler.submit(seq)
        tokens: list[int] = []
        emitted = ""
        try:
            for kind, token in seq.events():
                if kind != "token":
                    continue
                tokens.append(token)
                text = self.runner.detokenize(tokens)
                if not text.endswith("\ufffd") and len(text) > len(emitted):  # hold back half a UTF-8 character
                    yield text[len(emitted):]
                    emitted = text
        finally:
            seq.cancel()  # a no-op once finished; a caller that stopped reading frees its place in the batch
        text = self.runner.detokenize(tokens)
        if len(text) > len(emitted):
            yield text[len(emitted):]
        stats, compressor = seq.context["stats"], seq.context["compressor"]
        if compressor is not None:
            stats["compression"].update(compressor.stats())
        stats.update(prompt_tokens=layout.num_tokens, generated_tokens=len(tokens), mode=request.mode,
                     kv_bytes_final=seq.cache.nbytes(), decode_kernel=self.decode_weights.kernel,
                     prefill_kernel=self.runner.kernel)
        self._count(stats)
        ttft = seq.context["ttft"]
        yield GenerateResult(text=text, token_ids=tokens, prompt_token_ids=layout.token_ids, ttft_s=ttft,
                             total_s=time.perf_counter() - start, stats=stats)

    def _start_sequence(self, seq: Sequence) -> None:
        """The scheduler's prefill (on its thread): fill the cache by the request's mode,
        compress it, and leave the first token's logits."""
        request, layout = seq.request, seq.context["layout"]
        compressor = self._make_compressor(request, layout)
        observer = compressor.observer if compressor else None
        logits, stats, cache = self._prefill(request, layout, observer, seq.stopped, seq.context["compressions"])
        if compressor is not None:
            compressor.prepare(self.runner, cache, layout.token_ids, (0, layout.suffix_start))
            stats["compression"] = compressor.compress(cache)
        ttft = time.perf_counter() - seq.context["start"]
        stats["prefill_s"] = ttft
        stats["queued_s"] = seq.arrived - seq.context["start"]
        seq.cache, seq.logits, seq.next_position = cache, logits, layout.num_tokens
        seq.hooks = compressor.decode_hooks() if compressor else DecodeHooks()
        seq.context.update(stats=stats, compressor=compressor, ttft=ttft, stop_ids=self.runner.stop_token_ids)

    def _decode_sequences(self, seqs: list[Sequence]) -> None:
        """The scheduler's decode step: every sequence's last token through the model in one batch."""
        logits = decode_step(self.runner, self.decode_weights, [s.tokens[-1] for s in seqs],
                             [s.next_position + len(s.tokens) - 1 for s in seqs], [s.cache for s in seqs],
                             [s.hooks.observer for s in seqs])
        for seq, row in zip(seqs, logits):
            seq.logits = row
            if seq.hooks.after_step is not None:
                seq.hooks.after_step(seq.cache)

    def _make_compressor(self, request: GenerateRequest, layout: PromptLayout):
        spec = request.compression
        if spec is None or spec.policy == "none":
            return None
        from workers.eviction import make_compressor

        runner = self.runner
        return make_compressor(spec, runner.shape, prefix_len=layout.prefix_len, prompt_len=layout.num_tokens,
                               inv_freq=runner.inv_freq if runner.can_rerotate else None,
                               scale=runner.layers[0].self_attn.scaling, question_start=layout.suffix_start)

    def _prefill(self, request: GenerateRequest, layout: PromptLayout, observer, should_stop,
                 compressions: list[dict | None] | None = None):
        """-> (logits of the last prompt token, stats, filled cache), by the request's mode (workers/modes.py).
        compressions: per chunk, the spec it was ingested with (chunks given by the id of a compressed
        chunk), else None."""
        stats = {"chunks_hit": 0, "chunks_computed": 0, "recomputed_tokens": 0, "kv_bytes_loaded": 0,
                 "prefix_hit": False, "degraded": False}
        compressions = compressions or [None] * len(layout.chunk_spans)
        ctx = PrefillContext(
            self.runner, layout, observer, stats, prefix_kv=lambda: self._prefix_kv(layout),
            stored_chunks=lambda prefix: self._stored_chunks(request, layout, prefix, compressions, stats, should_stop),
            blend=lambda cache, computed, reuse, shift: self._blend(request, layout, cache, computed, reuse, shift,
                                                                    observer, stats))
        logits = PREFILL_MODES[request.mode](ctx)
        if stats.get("compressed_chunks"):
            compact(ctx.cache)  # the compressed chunks' dropped entries leave the cache
        return logits, stats, ctx.cache

    def _stored_chunks(self, request: GenerateRequest, layout: PromptLayout, prefix: ChunkKV,
                       compressions: list[dict | None], stats: dict, should_stop):
        """Every chunk's stored KV (computed and stored on a miss) placed after the prefix -> (cache, computed)."""
        chunks = []
        faults_before = self.store.counters.unavailable  # any store fault during this request degrades it
        for (start, end), compression in zip(layout.chunk_spans, compressions):
            if should_stop():
                raise Cancelled("request cancelled")
            kv, hit = self._load_or_compute(self.store, layout.token_ids[start:end],
                                            chunk_namespace(request.namespace, compression),
                                            compression=spec_from_json(compression))
            stats["chunks_hit" if hit else "chunks_computed"] += 1
            stats["kv_bytes_loaded"] += kv_nbytes(kv) if hit else 0
            chunks.append(kv)
        stats["degraded"] = self.store.degraded or self.store.counters.unavailable > faults_before
        stats["compressed_chunks"] = sum(c is not None for c in compressions)
        return fuse_chunks(self.runner, layout, prefix, chunks)

    def _blend(self, request: GenerateRequest, layout: PromptLayout, cache: KVCache, computed: torch.Tensor,
               reuse: bool, shift: bool | None, observer, stats: dict) -> torch.Tensor:
        """CacheBlend's selective recompute over the fused cache (reuse: the question only; shift: see
        blend_prefill) -> logits."""
        config, setting = self.blend_setting
        if request.recompute_ratio is not None:
            config, setting = config.with_ratio(request.recompute_ratio), "request"
        logits, blend_stats = blend_prefill(self.runner, layout, cache, computed, config, observer=observer,
                                            reuse=reuse, drift=self.drift, shift=shift)
        stats.update(blend_stats, blend_setting=setting)  # blend_config: what ran (per chunk kind)
        return logits

    def _count(self, stats: dict) -> None:
        self.counters.requests += 1
        self.counters.chunks_hit += stats["chunks_hit"]
        self.counters.chunks_computed += stats["chunks_computed"]
        self.counters.degraded += int(bool(stats["degraded"]))

    # -- admin ------------------------------------------------------------------
    def lookup(self, ids: Sequence[str], namespace: str = "") -> list[bool]:
        return [self._owned_header(i, namespace) is not None for i in ids]

    def pin(self, ids: Sequence[str], namespace: str = "") -> int:
        return sum(bool(self.store.pin(i)) for i in ids if self._owned_header(i, namespace) is not None)

    def unpin(self, ids: Sequence[str], namespace: str = "") -> int:
        return sum(bool(self.store.unpin(i)) for i in ids if self._owned_header(i, namespace) is not None)

    def evict(self, ids: Sequence[str], namespace: str = "") -> int:
        """The Evict RPC: delete these blocks (token-level eviction is workers/eviction, a different thing)."""
        return sum(bool(self.store.delete(i)) for i in ids if self._owned_header(i, namespace) is not None)

    def stats(self) -> EngineStats:
        runner = self.runner
        model = ModelInfo(runner.loaded.source, runner.fingerprint, str(runner.device), str(runner.dtype))
        return EngineStats(replace(self.counters), self.store.stats(), model, self.config.codec,
                           batch=replace(self.scheduler.stats), chunk_form=self.config.chunk_form)

    @property
    def max_batch(self) -> int:
        """Requests this engine serves at once (the server admits this many, then queues)."""
        return self.config.batch.max_batch

    def close(self) -> None:
        self.scheduler.close()
        self.store.close()


def blend_setting(config: EngineConfig, runner: ModelRunner) -> tuple[BlendConfig, str]:
    """What a blend request without a ratio runs: the model's stored calibration for this codec
    (`ragkv calibrate`), else `config.blend`; a request's own ratio keeps the method."""
    from workers.calibration import calibrated_config, load_calibration

    record = load_calibration(runner, config.codec, chunk_form=config.chunk_form) if config.use_calibration else None
    return (config.blend, "default") if record is None else (calibrated_config(record), "calibrated")
