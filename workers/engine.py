"""Engine: ingest chunks and answer requests in the four modes, over a block store and a model runner.

It only orchestrates; the math lives in blend.py, rope.py, eviction/ and the runner.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from kvstore.backends.base import Backend, StoreFullError
from kvstore.backends.memory import MemoryTier
from kvstore.backends.registry import open_backend
from kvstore.kv import ChunkKV
from kvstore.store import BlockStore
from ragkv.errors import Cancelled, InvalidArgument, NotFound, Unavailable
from workers.blend import BlendConfig, blend_prefill, fuse_chunks
from workers.cache import KVCache
from workers.generate import DecodeHooks, SamplingParams, decode
from workers.prompt import PromptLayout, build_prompt
from workers.requests import ChunkRef, GenerateRequest, GenerateResult, is_chunk_id
from workers.runner import ModelRunner

log = logging.getLogger("ragkv.engine")

PREFIX_CODEC = "fp16"  # the system-prompt prefix is reused as an exact prefix: keep it near-lossless
PREFIX_NAMESPACE = "\x00prefix"  # prefix blocks never collide with chunk blocks of the same tokens
MAX_CHUNK_TOKENS = 4096


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"
    store: str | None = None  # disk:PATH | redis://HOST:PORT/DB; None = disk under the cache dir
    codec: str = "kivi2"
    device: str | None = None
    memory_budget_bytes: int | None = 256 << 20  # in-memory tier in front of the store; None/0 = off
    store_budget_bytes: int | None = None
    workers: str = "inproc"
    blend: BlendConfig = field(default_factory=BlendConfig)


def default_store_url() -> str:
    from workers.model import cache_dir

    return f"disk:{cache_dir() / 'blocks'}"


def open_store_backend(config: EngineConfig) -> Backend:
    """The configured backend, behind an in-memory tier when it has a budget."""
    backend = open_backend(config.store or default_store_url(), budget_bytes=config.store_budget_bytes)
    if config.memory_budget_bytes:
        backend = MemoryTier(backend, config.memory_budget_bytes)
    return backend


class Engine:
    def __init__(self, config: EngineConfig, runner: ModelRunner | None = None):
        self.config = config
        self.runner = runner or ModelRunner.load(config.model, device=config.device)
        backend = open_store_backend(config)
        self.store = BlockStore(backend, config.codec, self.runner.fingerprint)
        # same backend, own codec: the codec is part of the address, so the two never collide
        self.prefix_store = BlockStore(backend, PREFIX_CODEC, self.runner.fingerprint)
        self._compute_lock = threading.Lock()  # one forward pass at a time: torch already uses every core
        self._prefix_cache: OrderedDict[str, ChunkKV] = OrderedDict()
        self._counters = {"requests": 0, "chunks_hit": 0, "chunks_computed": 0, "ingested": 0, "degraded": 0}
        self._pool = _chunk_pool(config)  # workers=ray|ray://|auto: chunk KV computed on Ray actors

    # -- chunks ---------------------------------------------------------------
    def _tokenize_chunk(self, text: str, field_name: str) -> list[int]:
        token_ids = self.runner.tokenize(text)
        if not token_ids:
            raise InvalidArgument(field_name, "has no tokens")
        if len(token_ids) > MAX_CHUNK_TOKENS:
            raise InvalidArgument(field_name, f"{len(token_ids)} tokens, over the limit of {MAX_CHUNK_TOKENS}")
        return token_ids

    def _load_or_compute(self, store, token_ids: list[int], namespace: str, pin: bool = False) -> tuple[ChunkKV, bool]:
        """(kv, was_hit); the caller holds the compute lock. A store fault is a miss: compute, store if it takes it."""
        address = store.address_for(token_ids, namespace)
        kv = store.get(address, token_ids)
        if kv is not None:
            if pin:
                store.pin(address)
            return kv, True
        if self._pool is not None and store is self.store:  # the actor writes the block; read it back
            self._pool.compute([token_ids], namespace, pin)
            kv = store.get(address, token_ids)
            if kv is not None:
                return kv, False
        data, kv = store.as_stored(self.runner.chunk_kv(token_ids))
        try:
            if store.put_raw(address, data) and pin:
                store.pin(address)
        except StoreFullError as exc:  # pinned blocks fill the budget: answer anyway, uncached
            log.warning("chunk %s not stored: %s", address[:16], exc)
        return kv, False

    def ingest(self, texts: Sequence[str], pin: bool = False, namespace: str = "") -> list[ChunkRef]:
        if not texts:
            raise InvalidArgument("chunks", "at least one chunk is required")
        token_lists = [self._tokenize_chunk(text, f"chunks[{i}]") for i, text in enumerate(texts)]
        refs = []
        for token_ids in token_lists:
            address = self.store.address_for(token_ids, namespace)
            # a verified header, not mere existence: a damaged or old-format block is dropped and recomputed
            header = self.store.get_header(address)
            cached = header is not None and list(header.token_ids) == token_ids
            if cached:
                if pin:
                    self.store.pin(address)
            else:
                with self._compute_lock:
                    self._load_or_compute(self.store, token_ids, namespace, pin=pin)
                self._counters["ingested"] += 1
            refs.append(ChunkRef(id=address, num_tokens=len(token_ids), cached=cached))
        return refs

    def _resolve_chunk(self, chunk: str, index: int, namespace: str) -> list[int]:
        if not is_chunk_id(chunk):
            return self._tokenize_chunk(chunk, f"chunks[{index}]")
        header = self._owned_header(chunk, namespace)
        if header is None and self.store.degraded:
            raise Unavailable(f"chunks[{index}]: the store is unavailable and the chunk was given by id only")
        if header is None:
            raise NotFound(f"chunks[{index}]: no stored chunk with id {chunk}")
        return list(header.token_ids)

    def _owned_header(self, chunk_id: str, namespace: str):
        """The stored block's header if `chunk_id` is the address of its tokens in `namespace`, else None.

        An id names a block, not a namespace: re-deriving the address from the block's own token
        ids and the caller's namespace keeps one namespace's blocks invisible to every other."""
        if not is_chunk_id(chunk_id):
            return None
        header = self.store.get_header(chunk_id)
        if header is None or self.store.address_for(header.token_ids, namespace) != chunk_id:
            return None
        return header

    def _prefix_kv(self, layout: PromptLayout) -> tuple[ChunkKV, bool]:
        address = self.prefix_store.address_for(layout.prefix_ids, PREFIX_NAMESPACE)
        if address in self._prefix_cache:
            self._prefix_cache.move_to_end(address)
            return self._prefix_cache[address], True
        kv, hit = self._load_or_compute(self.prefix_store, layout.prefix_ids, PREFIX_NAMESPACE, pin=True)
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
        """Yield text pieces as tokens are generated, then one GenerateResult."""
        start = time.perf_counter()
        should_stop = should_stop or (lambda: False)
        chunk_ids = [self._resolve_chunk(c, i, request.namespace) for i, c in enumerate(request.chunks)]
        layout = build_prompt(self.runner.tokenizer, request.system_prompt, chunk_ids, request.question)
        compressor = self._make_compressor(request, layout)
        observer = compressor.observer if compressor else None
        with self._compute_lock:
            logits, stats, cache = self._prefill(request, layout, observer, should_stop)
            if compressor is not None:
                stats["compression"] = compressor.compress(cache)
            ttft = time.perf_counter() - start
            stats["prefill_s"] = ttft
            hooks = compressor.decode_hooks() if compressor else DecodeHooks()
            hooks.should_stop = should_stop
            params = SamplingParams(request.max_new_tokens, request.temperature, request.top_p, request.seed)
            tokens: list[int] = []
            emitted = ""
            for token in decode(self.runner, cache, logits, layout.num_tokens, params, hooks):
                tokens.append(token)
                text = self.runner.detokenize(tokens)
                if not text.endswith("\ufffd") and len(text) > len(emitted):  # hold back half a UTF-8 character
                    yield text[len(emitted):]
                    emitted = text
            if should_stop():
                raise Cancelled("request cancelled")
        text = self.runner.detokenize(tokens)
        if len(text) > len(emitted):
            yield text[len(emitted):]
        if compressor is not None:
            stats["compression"].update(compressor.stats())
        stats.update(prompt_tokens=layout.num_tokens, generated_tokens=len(tokens), mode=request.mode,
                     kv_bytes_final=cache.nbytes())
        self._count(stats)
        yield GenerateResult(text=text, token_ids=tokens, prompt_token_ids=layout.token_ids, ttft_s=ttft,
                             total_s=time.perf_counter() - start, stats=stats)

    def _make_compressor(self, request: GenerateRequest, layout: PromptLayout):
        spec = request.compression
        if spec is None or spec.policy == "none":
            return None
        from workers.eviction import make_compressor

        runner = self.runner
        return make_compressor(spec, runner.shape, prefix_len=layout.prefix_len, prompt_len=layout.num_tokens,
                               inv_freq=runner.inv_freq if runner.can_rerotate else None,
                               scale=runner.layers[0].self_attn.scaling)

    def _prefill(self, request: GenerateRequest, layout: PromptLayout, observer, should_stop):
        """-> (logits of the last prompt token, stats, filled cache)."""
        runner, mode = self.runner, request.mode
        stats = {"chunks_hit": 0, "chunks_computed": 0, "recomputed_tokens": 0, "kv_bytes_loaded": 0,
                 "prefix_hit": False, "degraded": False}
        ids = torch.tensor(layout.token_ids, device=runner.device)
        positions = torch.arange(layout.num_tokens, device=runner.device)
        if mode == "full":
            cache = KVCache.empty(runner.shape.num_layers)
            logits = runner.forward(ids, positions, cache, observer=observer)
            stats["recomputed_tokens"] = layout.num_tokens
            return logits, stats, cache
        prefix, stats["prefix_hit"] = self._prefix_kv(layout)
        stats["kv_bytes_loaded"] += _nbytes(prefix) if stats["prefix_hit"] else 0
        if mode == "prefix":
            cache = KVCache.from_chunk(prefix, device=runner.device, dtype=runner.dtype)
            rest = slice(layout.prefix_len, None)
            logits = runner.forward(ids[rest], positions[rest], cache, observer=observer)
            stats["recomputed_tokens"] = layout.num_tokens - layout.prefix_len
            return logits, stats, cache
        chunks = []
        for (start, end) in layout.chunk_spans:
            if should_stop():
                raise Cancelled("request cancelled")
            kv, hit = self._load_or_compute(self.store, layout.token_ids[start:end], request.namespace)
            stats["chunks_hit" if hit else "chunks_computed"] += 1
            stats["kv_bytes_loaded"] += _nbytes(kv) if hit else 0
            chunks.append(kv)
        stats["degraded"] = self.store.degraded
        cache, computed = fuse_chunks(runner, layout, prefix, chunks)
        blend = self.config.blend
        config = BlendConfig(request.recompute_ratio, blend.check_layer, blend.deviation)
        logits, blend_stats = blend_prefill(runner, layout, cache, computed, config, observer=observer,
                                            reuse=mode == "reuse")
        stats.update(blend_stats)
        return logits, stats, cache

    def _count(self, stats: dict) -> None:
        self._counters["requests"] += 1
        self._counters["chunks_hit"] += stats["chunks_hit"]
        self._counters["chunks_computed"] += stats["chunks_computed"]
        self._counters["degraded"] += int(bool(stats["degraded"]))

    # -- admin ------------------------------------------------------------------
    def lookup(self, ids: Sequence[str], namespace: str = "") -> list[bool]:
        return [self._owned_header(i, namespace) is not None for i in ids]

    def pin(self, ids: Sequence[str], namespace: str = "") -> int:
        return sum(bool(self.store.pin(i)) for i in ids if self._owned_header(i, namespace) is not None)

    def unpin(self, ids: Sequence[str], namespace: str = "") -> int:
        return sum(bool(self.store.unpin(i)) for i in ids if self._owned_header(i, namespace) is not None)

    def evict(self, ids: Sequence[str], namespace: str = "") -> int:
        return sum(bool(self.store.evict(i)) for i in ids if self._owned_header(i, namespace) is not None)

    def stats(self) -> dict:
        return {"engine": dict(self._counters), "store": self.store.stats(), "model": {
            "source": self.runner.loaded.source, "fingerprint": self.runner.fingerprint,
            "device": str(self.runner.device), "dtype": str(self.runner.dtype)}, "codec": self.config.codec}

    def close(self) -> None:
        self.store.close()


def _chunk_pool(config: EngineConfig):
    """The process's Ray WorkerPool for `config.workers`, or None (inproc; auto with no cluster up)."""
    if config.workers in ("", "inproc"):
        return None
    from workers import ray_pool

    return None if ray_pool.resolve_workers(config.workers) == "inproc" else ray_pool.pool_for(config)


def _nbytes(kv: ChunkKV) -> int:
    return kv.keys.nbytes + kv.values.nbytes
