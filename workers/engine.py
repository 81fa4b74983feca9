"""Engine: ingest chunks and answer requests in every prefill mode (workers/modes.py), over a block store and a model runner.

It only orchestrates; the math lives in blend.py, rope.py, eviction/ and the runner.
"""

from __future__ import annotations

import array
import functools
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from kvstore.backends.base import Backend
from kvstore.backends.memory import MemoryTier
from kvstore.backends.registry import open_backend
from kvstore.codecs import DEFAULT_CODEC
from kvstore.store import BlockStore
from kvstore.text_index import IndexedChunk, TextIndex, paragraph_count
from workers.adaptive import RatioController, parse_ratios
from workers.allocator import retain_freed_memory
from workers.batching.scheduler import BatchConfig, Scheduler
from workers.batching.sequence import Sequence
from workers.blend import BlendConfig, server_setting
from workers.chat_prompt import chat_layout
from workers.chunk_forms import DEFAULT_CHUNK_FORM, chunk_fingerprint, compute_chunk
from workers.chunk_source import PREFIX_CODEC, ChunkLoader
from workers.context_drift import context_drift
from workers.errors import InvalidArgument, NotFound, Unavailable
from workers.eviction.chunks import check_ingest_spec, chunk_namespace, compression_json
from workers.generate import SamplingParams
from workers.key_plan import codec_for_model
from workers.modes import PrefillPlan, plan_for
from workers.openmp import release_pool
from workers.paths import default_store_url
from workers.projections import DEFAULT_PREFILL_KERNEL
from workers.prompt import build_prompt, template_file, use_template
from workers.request_state import RequestState
from workers.requests import ChunkRef, CompressionSpec, GenerateRequest, GenerateResult, is_chunk_id
from workers.runner import ModelRunner
from workers.sequences import SEQUENCE_CODEC, SequenceCache
from workers.shadow import Blended, ShadowVerifier
from workers.stats import EngineCounters, EngineStats, ModelInfo
from workers.steps import RequestSteps

if TYPE_CHECKING:
    from workers.protocol import ChunkCompute

log = logging.getLogger("ragkv.engine")

MAX_CHUNK_TOKENS = 4096
# chunk texts whose token ids are kept (RAG traffic repeats its documents; tokenizing took ~0.2 ms a chunk), up to
# a length: at most ~32 MB of texts and ids
CHUNK_TEXTS_KEPT, CHUNK_TEXT_KEPT_CHARS = 2048, 8192


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"
    store: str | None = None  # disk:PATH | redis://HOST:PORT/DB; None = disk under the cache dir
    codec: str = DEFAULT_CODEC  # chosen by the quality suite (kvstore/codecs/__init__.py, docs/benchmarks.md "Codecs")
    device: str | None = None
    memory_budget_bytes: int | None = 256 << 20  # in-memory tier in front of the store; None/0 = off
    decoded_budget_bytes: int = 512 << 20  # decoded chunk KV kept in front of the blocks (kvstore/decoded.py); 0 = off
    store_budget_bytes: int | None = None
    workers: str = "inproc"
    blend: BlendConfig = field(default_factory=server_setting)  # requests without a ratio (exact from EXACT_FROM)
    chunk_form: str = DEFAULT_CHUNK_FORM  # how a chunk's stored KV is computed (workers/chunk_forms.py)
    use_calibration: bool = True  # a stored calibration replaces `blend` for requests without a ratio
    batch: BatchConfig = field(default_factory=BatchConfig)  # continuous batching (workers/batching)
    prefill_kernel: str = DEFAULT_PREFILL_KERNEL  # the prefill's projections (workers/projections.py)
    retain_memory: bool = True  # keep freed host memory for the next request (workers/allocator.py)
    # exact KV of leading chunk runs, reused before anything is blended (workers/sequences.py)
    sequence_cache: bool = True
    # share of greedy blend requests re-run as a full prefill while idle, to measure agreement (workers/shadow.py)
    shadow_sample: float = 0.0
    # hold this answer agreement (shadow checks) by moving the ratio of requests without one along
    # adaptive_ratios, per namespace, deciding every adaptive_window checks (workers/adaptive.py); 0 = off
    adaptive_target: float = 0.0
    adaptive_ratios: str = "0.15,0.3,0.5,0.7"
    adaptive_window: int = 20
    # a Jinja chat template file replacing the model's own (workers/prompt.py); None: the model's, else PLAIN_TEMPLATE
    prompt_template: str | None = None


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
        if config.prompt_template:  # before anything is addressed: the template's tokens are the prompt's prefix
            use_template(self.runner.tokenizer, template_file(config.prompt_template))
        self._chunk_ids = functools.lru_cache(maxsize=CHUNK_TEXTS_KEPT)(
            lambda text: array.array("i", self.runner.tokenize(text)))  # 4 bytes an id; never handed out
        backend = open_store_backend(config)
        # decoded blocks land on the model's device: payload copied once, dequantized there (Triton on CUDA)
        # the chunk form is part of what a chunk block is addressed and verified by
        fingerprint = chunk_fingerprint(self.runner.kv_fingerprint, self.runner.tokenizer, config.chunk_form)
        self.store = BlockStore(backend, codec_for_model(config.codec, self.runner), fingerprint, device=self.runner.device,
                                decoded_budget_bytes=config.decoded_budget_bytes)
        shape = self.runner.shape  # a codec that cannot hold this model's KV is refused now, not at the first chunk
        self.store.codec.payload_size((shape.num_layers, shape.num_kv_heads, 1, shape.head_dim))
        # same backend, own codec: the codec is part of the address, so the two never collide
        self.prefix_store = BlockStore(backend, PREFIX_CODEC, self.runner.kv_fingerprint)
        # ingested texts by hash, beside the blocks: the HTTP API finds chunks pasted into a message
        self.text_index = TextIndex.open(config.store or default_store_url(), fingerprint)
        self.blend_setting = blend_setting(config, self.runner)  # (config, "calibrated" | "default")
        self._namespace_settings: dict[str, tuple[BlendConfig, str] | None] = {}
        if self.blend_setting[0].context_drift:  # read or measured now rather than at the first blend request
            context_drift(self.runner, config.chunk_form)
        self.counters = EngineCounters()
        self.sequences = (SequenceCache(BlockStore(backend, SEQUENCE_CODEC, self.runner.kv_fingerprint))
                          if config.sequence_cache else None)
        self.chunks = ChunkLoader(self.runner, self.store, self.prefix_store, config.chunk_form, chunk_compute,
                                  self.sequences)
        decode_weights = self.runner.decode_weights(config.batch.decode_kernel, config.batch.max_batch)
        self.steps = RequestSteps(self.runner, self.chunks, decode_weights, config.chunk_form)
        self.adaptive = adaptive_controller(config)
        self.shadow = ShadowVerifier(self.runner, decode_weights, config.shadow_sample, adaptive=self.adaptive)
        # continuous batching: the scheduler's one thread runs all model work (prefill, decode, ingest compute)
        self.scheduler = Scheduler(config.batch, self.steps.prefill, self.steps.decode)
        release_pool()  # this thread's OpenMP workers (model load, decode weights) would slow the scheduler's

    # -- chunks ---------------------------------------------------------------
    def tokenize_chunk(self, text: str, field_name: str) -> list[int]:
        """A chunk's token ids (a text seen before: looked up); InvalidArgument(field_name) when it has none or too
        many."""
        token_ids = list(self._chunk_ids(text)) if len(text) <= CHUNK_TEXT_KEPT_CHARS else self.runner.tokenize(text)
        if not token_ids:
            raise InvalidArgument(field_name, "has no tokens")
        if len(token_ids) > MAX_CHUNK_TOKENS:
            raise InvalidArgument(field_name, f"{len(token_ids)} tokens, over the limit of {MAX_CHUNK_TOKENS}")
        return token_ids

    def ingest(self, texts: Iterable[str], pin: bool = False, namespace: str = "",
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
                self.scheduler.call(lambda ids=token_ids: self.chunks.load_or_compute(
                    self.store, ids, block_namespace, pin=pin, compression=compression))
                self.counters.ingested += 1
            refs.append(ChunkRef(id=address, num_tokens=len(token_ids), cached=cached))
        spec = None if compression is None else compression_json(compression)
        self.text_index.record(texts, [IndexedChunk(r.id, r.num_tokens, paragraph_count(t), spec)
                                       for t, r in zip(texts, refs)], namespace)
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
        and every decode step run on the scheduler's thread (workers/steps.py), batched with the others."""
        start = time.perf_counter()
        if request.chat is not None:  # OpenAI-style messages, documents and pasted chunks (workers/chat_prompt.py)
            request, layout, compressions = chat_layout(
                self.runner.tokenizer, request, lambda c, i: self._resolve_chunk(c, i, request.namespace),
                self.tokenize_chunk, self.text_index)
        else:
            resolved = [self._resolve_chunk(c, i, request.namespace) for i, c in enumerate(request.chunks)]
            layout = build_prompt(self.runner.tokenizer, request.system_prompt, [ids for ids, _ in resolved],
                                  request.question)
            compressions = [c for _, c in resolved]
        plan, setting = self.plan(request, compressed=any(c is not None for c in compressions))
        state = RequestState(layout, plan, setting, compressions, start,
                             shadow=self.shadow.picks(plan, request.temperature))
        params = SamplingParams(request.max_new_tokens, request.temperature, request.top_p, request.seed)
        seq = Sequence(request, params, should_stop or (lambda: False),
                       kv_tokens=layout.num_tokens + request.max_new_tokens, state=state)
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
        if state.shadow:  # the answer is out: checked against a full prefill while idle
            stopped = len(tokens) < request.max_new_tokens
            adaptive_ratio = state.plan.blend.recompute_ratio if state.blend_setting == "adaptive" else None
            blended = Blended(request.namespace, layout.token_ids, state.first_logits, list(tokens), stopped,
                              adaptive_ratio)
            self.shadow.queued(self.scheduler.defer(self.shadow.job(blended)))
        stats = state.stats()
        stats.update(generated_tokens=len(tokens), kv_bytes_final=seq.cache.nbytes(),
                     decode_kernel=self.steps.decode_weights.kernel, prefill_kernel=self.runner.kernel)
        self._count(stats)
        yield GenerateResult(text=text, token_ids=tokens, prompt_token_ids=layout.token_ids, ttft_s=state.ttft_s,
                             total_s=time.perf_counter() - start, stats=stats)

    def plan(self, request: GenerateRequest, compressed: bool = False) -> tuple[PrefillPlan, str]:
        """The request's prefill plan (workers/modes.py) and where its blend setting came from: the server's
        (calibrated for the request's namespace, calibrated, or default), at the adaptive ratio when that is on,
        or the request's own ratio with the server's method. The server's setting is served exactly at or above
        its `exact_from` (BlendConfig.exact), except over chunks compressed at ingest (`compressed`): those are
        read in the form they were stored in."""
        setting, source = self.setting_for(request.namespace)
        if compressed:
            setting = replace(setting, exact_from=None)
        if request.recompute_ratio is not None:
            setting, source = setting.with_ratio(request.recompute_ratio), "request"
        elif self.adaptive is not None:
            ratio = self.adaptive.ratio(request.namespace, start=setting.recompute_ratio)  # from its setting
            setting, source = setting.with_ratio(ratio), "adaptive"
        return plan_for(request.mode, setting), source

    def setting_for(self, namespace: str) -> tuple[BlendConfig, str]:
        """The blend setting of requests without a ratio: the namespace's own calibration (`ragkv calibrate
        --requests --namespace`), else the server's (read once per namespace)."""
        if not namespace or not self.config.use_calibration:
            return self.blend_setting
        if namespace not in self._namespace_settings:
            own = blend_setting(self.config, self.runner, namespace)
            self._namespace_settings[namespace] = own if own[1] == "calibrated" else None
        return self._namespace_settings[namespace] or self.blend_setting

    def _count(self, stats: dict) -> None:
        self.counters.requests += 1
        self.counters.chunks_hit += stats["chunks_hit"]
        self.counters.chunks_computed += stats["chunks_computed"]
        self.counters.degraded += int(bool(stats["degraded"]))

    # -- admin ------------------------------------------------------------------
    def lookup(self, ids: Iterable[str], namespace: str = "") -> list[bool]:
        return [self._owned_header(i, namespace) is not None for i in ids]

    def pin(self, ids: Iterable[str], namespace: str = "") -> int:
        return sum(bool(self.store.pin(i)) for i in ids if self._owned_header(i, namespace) is not None)

    def unpin(self, ids: Iterable[str], namespace: str = "") -> int:
        return sum(bool(self.store.unpin(i)) for i in ids if self._owned_header(i, namespace) is not None)

    def evict(self, ids: Iterable[str], namespace: str = "") -> int:
        """The Evict RPC: delete these blocks (token-level eviction is workers/eviction, a different thing)."""
        return sum(bool(self.store.delete(i)) for i in ids if self._owned_header(i, namespace) is not None)

    def stats(self) -> EngineStats:
        runner = self.runner
        model = ModelInfo(runner.loaded.source, runner.fingerprint, str(runner.device), str(runner.dtype))
        return EngineStats(replace(self.counters), self.store.stats(), model, self.config.codec,
                           batch=replace(self.scheduler.stats), chunk_form=self.config.chunk_form,
                           sequences=None if self.sequences is None else replace(self.sequences.counters),
                           shadow=self.shadow.stats.as_dict(),
                           adaptive=None if self.adaptive is None else self.adaptive.as_dict())

    @property
    def max_batch(self) -> int:
        """Requests this engine serves at once (the server admits this many, then queues)."""
        return self.config.batch.max_batch

    def close(self) -> None:
        self.scheduler.close()
        self.store.close()
        self.text_index.close()


def adaptive_controller(config: EngineConfig) -> RatioController | None:
    """The adaptive ratio's controller when `adaptive_target` is set (it needs the shadow checks), else None."""
    if not config.adaptive_target:
        return None
    if config.shadow_sample <= 0:
        raise ValueError("adaptive_target: needs shadow_sample > 0 (the shadow checks steer the ratio)")
    return RatioController(config.adaptive_target, parse_ratios(config.adaptive_ratios), config.adaptive_window)


def blend_setting(config: EngineConfig, runner: ModelRunner, namespace: str = "") -> tuple[BlendConfig, str]:
    """What a blend request without a ratio runs: the model's stored calibration for this codec
    (`ragkv calibrate`), else `config.blend`; a request's own ratio keeps the method."""
    from workers.calibration import calibrated_config, load_calibration

    record = (load_calibration(runner, config.codec, chunk_form=config.chunk_form, namespace=namespace)
              if config.use_calibration else None)
    if record is None:
        return config.blend, "default"
    return replace(calibrated_config(record), exact_from=config.blend.exact_from), "calibrated"
