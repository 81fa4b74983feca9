"""ModelRunner: a plain-torch decoder forward pass, layer by layer, over a KVCache.

The transformers model supplies the weights and modules (projections, norms,
MLP, rotary frequencies); the runner owns the loop, so blending can send a
subset of tokens through later layers and eviction can look at queries.
Batch size is 1: hidden states are [S, hidden].

Two families (workers/model.py): Llama (Llama, Mistral, Qwen2/3, SmolLM) and Gemma 3. What differs is
read from the modules once, per layer (`ModelShape`, `windows`, `layer_inv_freq`):

    Gemma 3   sliding-window layers (a query at p sees cached positions in [p - window + 1, p]),
              local and global layers with different RoPE bases, four norms per layer
              (attention and MLP outputs are normed before the residual), q/k norms, GELU.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from kvstore.kv import ChunkKV
from kvstore.rope import RE_ROTATABLE_ROPE_TYPES, RopeTable, apply_rope
from workers import rotary
from workers.attention import PlanMemo, attend
from workers.cache import KVCache, LayerKV
from workers.model import DEFAULT_MODEL, LoadedModel, load_model
from workers.prompt import use_template
from workers.projections import (EXACT_PREFILL_KERNEL, PREFILL_KERNELS, Projections, kernel_fingerprint,
                                resolve_prefill_kernel)


class AttentionObserver(Protocol):
    """Sees each layer's queries and the KV they attend to (eviction scoring, diagnostics)."""

    def __call__(self, layer: int, q: torch.Tensor, q_positions: torch.Tensor, kv: LayerKV) -> None: ...


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int


def _rope_type(params: dict | None) -> str:
    params = params or {}
    return params.get("rope_type", params.get("type", "default")) or "default"


@dataclass(frozen=True)
class LayerRope:
    """Each layer's RoPE: Llama has one table for all layers, Gemma 3 one per layer type."""

    tables: tuple[torch.Tensor, ...]  # the distinct frequency tables [D/2] fp32
    index: tuple[int, ...]  # per layer: its table in `tables`
    scale: float  # attention_scaling (the same for every layer)
    rope_types: frozenset[str]

    @classmethod
    def of(cls, model) -> "LayerRope":
        config, rotary = model.config, model.model.rotary_emb
        layers = config.num_hidden_layers
        if hasattr(rotary, "inv_freq"):  # one table
            params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
            return cls((rotary.inv_freq.detach().float(),), (0,) * layers,
                       float(getattr(rotary, "attention_scaling", 1.0)), frozenset({_rope_type(params)}))
        types = config.layer_types  # Gemma 3: "<layer type>_inv_freq" buffers
        kinds = list(dict.fromkeys(types))  # in order of first use
        scales = {float(getattr(rotary, f"{t}_attention_scaling")) for t in kinds}
        if len(scales) != 1:
            raise ValueError(f"layers with different RoPE attention scaling {sorted(scales)} are not supported")
        return cls(tuple(getattr(rotary, f"{t}_inv_freq").detach().float() for t in kinds),
                   tuple(kinds.index(t) for t in types), scales.pop(), frozenset(rotary.rope_type[t] for t in kinds))

    def stacked(self) -> torch.Tensor:
        """[D/2] when every layer shares one table, else [L, 1, 1, D/2]: broadcasts over keys [L, H, T, D/2]."""
        if len(self.tables) == 1:
            return self.tables[0]
        return torch.stack([self.tables[i] for i in self.index])[:, None, None, :]


def sliding_windows(config) -> tuple[int | None, ...]:
    """Per layer: the sliding window (Gemma 3's local layers; every layer of a Mistral config with one) or None
    (attends to every earlier position)."""
    window = getattr(config, "sliding_window", None)
    everywhere = "sliding_attention" if window and getattr(config, "use_sliding_window", True) else "full_attention"
    types = getattr(config, "layer_types", None) or [everywhere] * config.num_hidden_layers
    if any(t not in ("full_attention", "sliding_attention") for t in types):
        raise ValueError(f"layer types {sorted(set(types))} are not supported")
    return tuple(window if t == "sliding_attention" and window else None for t in types)


class ModelRunner:
    _loaded: dict[tuple, "ModelRunner"] = {}

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        use_template(self.tokenizer)  # a base model gets the plain documents-then-question template
        self.fingerprint = loaded.fingerprint
        config = self.model.config
        self.config = config
        self.shape = ModelShape(
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
        )
        self.layers = self.model.model.layers
        for cap in ("attn_logit_softcapping", "final_logit_softcapping"):  # Gemma 2's; None in Gemma 3
            if getattr(config, cap, None) is not None:
                raise ValueError(f"{cap} is not supported")
        self.rope = LayerRope.of(self.model)  # the distinct tables and each layer's
        self.inv_freq = self.rope.stacked()  # [D/2], or [L, 1, 1, D/2] (Gemma 3): over a chunk's keys [L, H, T, D]
        self.rope_scale = self.rope.scale
        self.windows = sliding_windows(config)  # per layer: None or the sliding window
        self.sandwich_norms = hasattr(self.layers[0], "pre_feedforward_layernorm")  # Gemma: norms around attn and MLP
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.rope_cache = [RopeTable(f, self.rope_scale, self.dtype) for f in self.rope.tables]  # cos/sin by position
        self._decode_weights: dict[tuple[str, int], object] = {}
        self.kernel = EXACT_PREFILL_KERNEL  # prefill projections (workers/projections.py); with_kernel() for others
        self.projections: Projections = PREFILL_KERNELS[self.kernel](self.layers, self.model.lm_head)
        self._with_kernel: dict[str, "ModelRunner"] = {self.kernel: self}

    def with_kernel(self, kernel: str) -> "ModelRunner":
        """This runner with another prefill kernel: the same model and weights (built once per kernel).
        `auto` is resolved for this runner's device (workers/projections.py)."""
        kernel = resolve_prefill_kernel(kernel, self.device)
        if kernel not in self._with_kernel:
            sibling = copy.copy(self)
            sibling.kernel = kernel
            sibling.projections = PREFILL_KERNELS[kernel](self.layers, self.model.lm_head)
            self._with_kernel[kernel] = sibling  # the dict is shared: any sibling finds the others
        return self._with_kernel[kernel]

    @property
    def kv_fingerprint(self) -> str:
        """What this runner's KV blocks are addressed by: the model and the prefill kernel."""
        return kernel_fingerprint(self.fingerprint, self.kernel)

    @classmethod
    def load(cls, source: str = DEFAULT_MODEL, device: str | None = None, dtype: torch.dtype | None = None) -> "ModelRunner":
        """Load once per process per (source, device, dtype).

        The loaded model lives as long as the process, so its objects (~380k for the default model) leave the
        garbage collector's scans: a full collection walked them in 0.28 s, and the scheduler collects when it
        goes idle after work, so a request sent right after another waited that long."""
        key = (source, device, dtype)
        if key not in cls._loaded:
            cls._loaded[key] = cls(load_model(source, device=device, dtype=dtype))
            gc.collect()  # only what is alive is frozen
            gc.freeze()
        return cls._loaded[key]

    # -- text ---------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @property
    def rope_type(self) -> str:
        return "+".join(sorted(self.rope.rope_types))

    @property
    def can_rerotate(self) -> bool:
        return self.rope.rope_types <= RE_ROTATABLE_ROPE_TYPES

    def layer_inv_freq(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s RoPE frequencies [D/2] (for one layer's keys [H, T, D])."""
        return self.rope.tables[self.rope.index[layer]]

    @property
    def stop_token_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        ids.update(eos if isinstance(eos, list) else [eos])
        return {i for i in ids if i is not None}

    def decode_weights(self, kernel: str, pad_rows: int):
        """The weights in a batched decode kernel's form (workers/batching), built once per (kernel, rows)."""
        from workers.batching.step import build_decode_weights

        key = (kernel, pad_rows if kernel == "fp32" else 0)  # only fp32 pads rows
        if key not in self._decode_weights:
            self._decode_weights[key] = build_decode_weights(self, kernel, pad_rows)
        return self._decode_weights[key]

    # -- forward pieces -----------------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids: [S] -> hidden: [S, hidden]."""
        return self.model.model.embed_tokens(token_ids.to(self.device))

    def qkv(self, layer: int, normed: torch.Tensor, positions: torch.Tensor):
        """normed: [S, hidden] -> q [Hq, S, D], k [Hkv, S, D] (both RoPE'd at positions), v [Hkv, S, D]."""
        attn = self.layers[layer].self_attn
        seq, head_dim = normed.shape[0], self.shape.head_dim
        q, k, v = (x.reshape(seq, -1, head_dim) for x in self.projections.qkv(layer, normed))
        if getattr(attn, "q_norm", None) is not None:  # Qwen3, Gemma 3
            q = attn.q_norm(q)
        q, k = self._rotated(layer, positions, q, self._k_normed(layer, k))
        return q, k, v.transpose(0, 1)

    def kv(self, layer: int, normed: torch.Tensor, positions: torch.Tensor):
        """normed: [S, hidden] -> k [Hkv, S, D] (RoPE'd at positions), v [Hkv, S, D]: qkv's, bit for bit,
        without the queries (blend's choice of tokens compares fresh K/V only)."""
        seq, head_dim = normed.shape[0], self.shape.head_dim
        k, v = (x.reshape(seq, -1, head_dim) for x in self.projections.kv(layer, normed))
        (k,) = self._rotated(layer, positions, self._k_normed(layer, k))
        return k, v.transpose(0, 1)

    def _k_normed(self, layer: int, k: torch.Tensor) -> torch.Tensor:
        """k [S, Hkv, D], normed where the model norms its keys (Qwen3, Gemma 3)."""
        k_norm = getattr(self.layers[layer].self_attn, "k_norm", None)
        return k if k_norm is None else k_norm(k)

    def _rotated(self, layer: int, positions: torch.Tensor, *xs: torch.Tensor) -> list[torch.Tensor]:
        """Each x [S, H, D] RoPE'd at positions -> [H, S, D], the layer's table looked up once: one C pass over the
        rows where it runs (workers/rotary.py), else apply_rope over the positions' rows of the table (the same
        values)."""
        cos, sin = self.rope_cache[self.rope.index[layer]].covering(positions)  # scaled, in the model dtype
        if all(rotary.rows_fit(x, cos) for x in xs):
            return [rotary.rotate_rows(x, positions, cos, sin) for x in xs]
        cos, sin = cos[positions], sin[positions]  # [S, D]
        return [apply_rope(x.transpose(0, 1), cos, sin) for x in xs]

    def layer_forward(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                      slots: torch.Tensor | None = None, observer: AttentionObserver | None = None,
                      plans: PlanMemo | None = None) -> torch.Tensor:
        """One decoder layer. New K/V are appended to the cache, or written over `slots` [S] when given.
        `plans`: attention plans shared by the layers of one pass (attention.PlanMemo)."""
        block = self.layers[layer]
        q, k, v = self.qkv(layer, block.input_layernorm(hidden), positions)
        if slots is None:
            kv = cache.update(layer, k, v, positions)
        else:
            kv = cache.layers[layer]  # index_copy_: keys[:, slots] = k's writes, without advanced indexing
            kv.keys.index_copy_(1, slots, k)
            kv.values.index_copy_(1, slots, v)
        if observer is not None:
            observer(layer, q, positions, kv)
        window = self.windows[layer]
        bf16 = self.projections.attention_bf16
        plan = None if plans is None else plans.plan(positions, kv.positions, kv.head_mask, q.shape[0], window, q.dtype,
                                                     bf16)
        out = attend(q, kv.keys, kv.values, positions, kv.positions, block.self_attn.scaling, kv.head_mask, window, plan,
                     bf16)
        out = self.projections.o(layer, out)
        # the first residual makes this layer's own tensor; the second adds into it (the same bits, one buffer less)
        if self.sandwich_norms:  # Gemma: h += norm(attn); h += norm(mlp(norm(h)))
            hidden = hidden + block.post_attention_layernorm(out)
            mlp = self.projections.mlp(layer, block.pre_feedforward_layernorm(hidden))
            return hidden.add_(block.post_feedforward_layernorm(mlp))
        hidden = hidden + out
        return hidden.add_(self.projections.mlp(layer, block.post_attention_layernorm(hidden)))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [S, hidden] -> logits [S, vocab] (fp32)."""
        return self.projections.head(self.model.model.norm(hidden))

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                observer: AttentionObserver | None = None, last_only: bool = True,
                layers: range | None = None) -> torch.Tensor:
        """Run tokens through all layers, appending their K/V; returns logits (of the last token by default)."""
        positions = positions.to(self.device)
        hidden = self.embed(token_ids)
        for layer in layers or range(self.shape.num_layers):
            hidden = self.layer_forward(layer, hidden, positions, cache, observer=observer)
        return self.logits(hidden[-1:] if last_only else hidden)

    @torch.inference_mode()
    def chunk_kv(self, token_ids: list[int], layer_input: Callable[[int, torch.Tensor], None] | None = None) -> ChunkKV:
        """KV of one chunk computed on its own, at positions 0..n-1.

        layer_input(layer, hidden [T, hidden]) sees each layer's input (LoRA's low-rank parts are taken there).
        """
        if not token_ids:
            raise ValueError("chunk has no tokens")
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        positions = torch.arange(len(token_ids), device=self.device)
        cache = KVCache.empty(self.shape.num_layers)
        hidden = self.embed(ids)
        for layer in range(self.shape.num_layers):
            if layer_input is not None:
                layer_input(layer, hidden)
            hidden = self.layer_forward(layer, hidden, positions, cache)
        # the keys' RoPE frequencies travel with them: a pre-RoPE codec un-rotates with them
        return dataclasses.replace(cache.to_chunk(token_ids), inv_freq=self.inv_freq)

