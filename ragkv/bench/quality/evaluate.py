"""One runner for every configuration: prefill each prompt once, fan the configurations out over it.

Per prompt: the full prefill runs once, watched by every eviction config's observer; full's greedy
answer is the reference. Each configuration then prepares its cache (chunk KV computed once per
prompt and stored through each codec once), and is scored three ways:

- accuracy: every expected answer appears in its greedy text;
- agreement: its greedy tokens equal full's, token for token;
- KL: mean KL(full || config) of next-token distributions, teacher-forced on full's answer.

Teacher forcing comes first; when its argmax already reproduces full's answer (and the stop after
it) and the config has no decode-time hooks, the greedy answer *is* full's and decoding is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from kvstore.backends.memory import MemoryBackend
from kvstore.kv import ChunkKV
from kvstore.store import BlockStore
from ragkv.bench.divergence import kl_rows, teacher_forced
from ragkv.bench.eviction import clone
from ragkv.bench.quality.configs import ConfigKind, Eviction, Prepared
from ragkv.bench.quality.families import QualityPrompt
from workers.blend import BlendConfig
from workers.cache import KVCache
from workers.chunk_forms import DEFAULT_CHUNK_FORM, compute_chunk
from workers.chunk_source import PREFIX_CODEC
from workers.generate import SamplingParams, decode
from workers.key_plan import codec_for_model
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.prompt import PromptLayout, build_prompt
from workers.requests import CompressionSpec
from workers.rope import rerotate_keys


@dataclass
class Outcome:
    correct: bool
    agree: bool
    kl: float
    text: str
    kv_bytes: float = 1.0  # bytes of the config's prompt cache / the full prefill's (real removal shows here)


@dataclass
class PromptContext:
    """Everything the configs of one prompt share; expensive parts are computed once, on first use."""

    runner: object
    prompt: QualityPrompt
    codec: str  # the suite's default codec for blend / reuse configs
    configs: list[ConfigKind]
    default_blend: BlendConfig | None = None  # what `blend` runs: the engine's setting for this model and codec
    chunk_form: str = DEFAULT_CHUNK_FORM  # how `blend` / `reuse` chunks are computed: the engine's form
    _forms: dict[str, list[ChunkKV]] = field(default_factory=dict)
    _stores: dict[str, BlockStore] = field(default_factory=dict)
    _stored: dict[tuple[str, str], list[ChunkKV]] = field(default_factory=dict)  # (codec, form) -> chunks
    _in_context: dict[str, list[ChunkKV]] = field(default_factory=dict)
    _compressors: dict[str, object] = field(default_factory=dict)

    @cached_property
    def layout(self) -> PromptLayout:
        tokenize = self.runner.tokenize
        return build_prompt(self.runner.tokenizer, self.prompt.system_prompt,
                            [tokenize(c) for c in self.prompt.chunks], self.prompt.question)

    # -- the shared full prefill ---------------------------------------------------
    def prefill(self) -> None:
        observers = [o for o in (c.observer(self) for c in self.configs) if o is not None]

        def observe(layer, q, q_positions, kv):
            for o in observers:
                o(layer, q, q_positions, kv)

        n = self.layout.num_tokens
        out = run_prefill(self.runner, self.layout, plan_for("full", BlendConfig()),
                          observer=observe if observers else None)
        self.full_cache, self.full_logits = out.cache, out.logits
        self.full_tokens = list(decode(self.runner, self.full_cache_copy(), self.full_logits, n, self.params))
        self.full_rows = self.answer_rows(Prepared(self.full_logits, self.full_cache_copy()))

    def full_cache_copy(self) -> KVCache:
        return clone(self.full_cache)

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.prompt.max_new_tokens)

    def answer_rows(self, prepared: Prepared) -> torch.Tensor:
        """[len(full answer) + 1, vocab]: logits before each of full's answer tokens and after the last.
        Teacher-forces over `prepared.cache` (the caller passes a copy if it still needs the cache)."""
        tokens = self.full_tokens
        first = prepared.logits.reshape(1, -1).float()
        if not tokens:
            return first
        later = teacher_forced(self.runner, prepared.cache, tokens + [tokens[-1]], self.layout.num_tokens)
        return torch.cat([first, later.float()])

    # -- chunk KV, computed once per prompt ------------------------------------------
    def store(self, codec: str) -> BlockStore:
        if codec not in self._stores:
            self._stores[codec] = BlockStore(MemoryBackend(), codec_for_model(codec, self.runner), self.runner.fingerprint)
        return self._stores[codec]

    @property
    def exact_chunks(self) -> list[ChunkKV]:
        """Each chunk's KV as ingest computes it in the engine's chunk form, before the codec."""
        return self.form_chunks(self.chunk_form)

    def form_chunks(self, form: str) -> list[ChunkKV]:
        """Each chunk's KV computed in `form` (workers/chunk_forms.py: alone, or after the lead-in)."""
        if form not in self._forms:
            ids = self.layout.token_ids
            self._forms[form] = [compute_chunk(self.runner, ids[start:end], form) for start, end in self.layout.chunk_spans]
        return self._forms[form]

    def stored_chunks(self, codec: str, form: str | None = None) -> list[ChunkKV]:
        """The chunks as a store hit through `codec` decodes them (`form`: None = the engine's)."""
        form = form or self.chunk_form
        if (codec, form) not in self._stored:
            self._stored[codec, form] = [self.store(codec).as_stored(kv)[1] for kv in self.form_chunks(form)]
        return self._stored[codec, form]

    def in_context_chunks(self, codec: str) -> list[ChunkKV]:
        """Each chunk's span of the full prefill's KV (its real context), moved to positions 0.. and stored
        through `codec`: the KV a perfect blend would store, with codec error only."""
        if codec not in self._in_context:
            ids, chunks = self.layout.token_ids, []
            for start, end in self.layout.chunk_spans:
                keys = torch.stack([layer.keys[:, start:end] for layer in self.full_cache.layers])  # [L, H, T, D]
                values = torch.stack([layer.values[:, start:end] for layer in self.full_cache.layers])
                kv = ChunkKV(rerotate_keys(keys, -start, self.runner.inv_freq), values, ids[start:end],
                             inv_freq=self.runner.inv_freq)  # a pre-RoPE codec un-rotates with these
                chunks.append(self.store(codec).as_stored(kv)[1])
            self._in_context[codec] = chunks
        return self._in_context[codec]

    def prefix_kv(self) -> ChunkKV:
        """The system-prompt prefix as the engine reuses it (an exact prefix, stored fp16)."""
        if "prefix" not in self._stored:
            p = self.layout.prefix_len
            keys = torch.stack([layer.keys[:, :p] for layer in self.full_cache.layers])
            values = torch.stack([layer.values[:, :p] for layer in self.full_cache.layers])
            kv = ChunkKV(keys, values, self.layout.prefix_ids)
            self._stored["prefix"] = [self.store(PREFIX_CODEC).as_stored(kv)[1]]
        return self._stored["prefix"][0]

    def prefix_prefill(self) -> tuple[torch.Tensor, KVCache]:
        out = run_prefill(self.runner, self.layout, plan_for("prefix", BlendConfig()), HeldChunks(self.prefix_kv()))
        return out.logits, out.cache

    def compressor(self, config: Eviction):
        """One compressor per eviction config; it observes the shared full prefill."""
        if config.name not in self._compressors:
            from workers.eviction import make_compressor

            spec = CompressionSpec(policy=config.policy, budget=config.budget, protect_system_prompt=config.protect)
            runner = self.runner
            self._compressors[config.name] = make_compressor(
                spec, runner.shape, self.layout.prefix_len, self.layout.num_tokens, inv_freq=runner.inv_freq,
                scale=runner.layers[0].self_attn.scaling, question_start=self.layout.suffix_start)
        return self._compressors[config.name]

    # -- one configuration -------------------------------------------------------------
    def score(self, config: ConfigKind) -> Outcome:
        prepared = config.prepare(self)
        kv_bytes = prepared.cache.nbytes() / self.full_cache.nbytes()
        needs_decode = prepared.hooks.after_step is not None
        rows = self.answer_rows(Prepared(prepared.logits, clone(prepared.cache)))
        reference = self.full_rows
        kl = float(kl_rows(reference, rows).mean())
        predicted = rows.argmax(-1).tolist()
        tokens = self.full_tokens
        if not needs_decode and self._reproduces_full(predicted):
            generated = list(tokens)
        else:
            generated = list(decode(self.runner, prepared.cache, prepared.logits, self.layout.num_tokens,
                                    self.params, prepared.hooks))
        text = self.runner.detokenize(generated)
        return Outcome(correct=self.prompt.correct(text), agree=generated == tokens, kl=kl, text=text,
                       kv_bytes=kv_bytes)

    def _reproduces_full(self, predicted: list[int]) -> bool:
        tokens = self.full_tokens
        if predicted[:len(tokens)] != tokens:
            return False
        return len(tokens) == self.prompt.max_new_tokens or predicted[len(tokens)] in self.runner.stop_token_ids


def evaluate_prompt(runner, prompt: QualityPrompt, configs: list[ConfigKind], codec: str,
                    on_config=None, default_blend: BlendConfig | None = None) -> dict[str, Outcome]:
    """-> {config name: Outcome}, with `full` always first."""
    ctx = PromptContext(runner, prompt, codec, configs, default_blend)
    ctx.prefill()
    full_text = runner.detokenize(ctx.full_tokens)
    out = {"full": Outcome(prompt.correct(full_text), True, 0.0, full_text)}
    for config in configs:
        if config.name != "full":
            out[config.name] = ctx.score(config)
        if on_config is not None:
            on_config(config.name)
    return out
