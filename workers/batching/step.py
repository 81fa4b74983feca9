"""One decode step for a batch of requests: every running request's next token in one forward.

The projections and the MLP run once over all rows ([B, hidden]) through batch-invariant kernels
(linear.py), so the weights are read once per step, not once per request. Each layer is one
scripted function (layer.py); this file builds its arguments and walks the layers. Attention runs per row,
each over its own position-tagged cache, so blended, evicted and per-head caches work unchanged,
and a row's arithmetic is the same in a batch of 16 as alone.

Both model families of workers/runner.py: Llama (one RoPE table, SiLU) and Gemma 3 (four norms per
layer scaling by 1 + weight, GELU-tanh, a RoPE table per layer type, sliding-window layers).
What the step cannot compute the way the runner's forward does is refused when the weights are built.

With the `avx2` kernel a plain Llama model's layers run as one C call each (avx2.py): the same
arithmetic, without the per-op dispatch. A model or machine it cannot serve decodes with `int4`,
and `DecodeWeights.note` says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import torch

from kvstore.rope import rope_cos_sin
from workers.batching import avx2
from workers.batching.layer import GELU_TANH, SILU, decode_layer, rms_norm
from workers.batching.linear import DECODE_KERNELS, Avx2Linear, DecodeLinear
from workers.cache import KVCache, LayerKV

ACTIVATIONS = {"silu": SILU, "gelu_pytorch_tanh": GELU_TANH}  # config's MLP activation -> decode_layer's code
log = logging.getLogger(__name__)


@dataclass
class Norm:
    """An RMSNorm as layer.rms_norm applies it: the scale [n] and epsilon.

    LlamaRMSNorm scales by its weight (the model's dtype) after the cast back; Gemma3RMSNorm by
    (1 + weight) in fp32 before it, so its scale is kept as that fp32 tensor. Which one a module is
    comes from what it computes (`of`)."""

    weight: torch.Tensor
    eps: float

    @classmethod
    def of(cls, module: torch.nn.Module) -> "Norm":
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        weight = getattr(module, "weight", None)
        if eps is None or weight is None:
            raise ValueError(f"decode step: {type(module).__name__} is not an RMSNorm with a weight and an epsilon")
        weight = weight.detach()
        forms = (cls(weight, float(eps)), cls(1 + weight.float(), float(eps)))  # LlamaRMSNorm's, Gemma3RMSNorm's
        errors = [form.error_against(module) for form in forms]
        if min(errors) > (1e-5 if weight.dtype == torch.float32 else 1e-2):
            raise ValueError(f"decode step: {type(module).__name__} computes neither weight * rms_norm(x) "
                             f"nor (1 + weight) * rms_norm(x)")
        return forms[errors.index(min(errors))]

    def error_against(self, module: torch.nn.Module) -> float:
        """Largest difference from `module` on a few random rows, relative to its largest output."""
        x = torch.randn(4, self.weight.shape[-1], generator=torch.Generator().manual_seed(0))
        x = x.to(self.weight.device, module.weight.dtype)
        with torch.no_grad():
            want = module(x).float()
        return float((self(x).float() - want).abs().max()) / max(float(want.abs().max()), 1e-30)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


@dataclass
class DecodeLayer:
    """One decoder layer as the decode step uses it: its kernels and what it reads from the modules."""

    qkv: DecodeLinear  # hidden -> [q | k | v]
    qkv_bias: torch.Tensor | None  # Qwen2
    o: DecodeLinear
    gate_up: DecodeLinear  # hidden -> [gate | up]
    down: DecodeLinear
    input_norm: Norm
    post_norm: Norm  # post_attention_layernorm: Llama's MLP input norm, Gemma 3's attention output norm
    scaling: float
    qk_norms: tuple[Norm, Norm] | None  # Qwen3, Gemma 3: per-head norms of q and k before RoPE
    ffn_norms: tuple[Norm, Norm] | None  # Gemma 3: the MLP's input and output norms
    activation: int  # layer.SILU or layer.GELU_TANH
    window: int | None  # sliding window: the newest token at p sees positions in [p - window + 1, p]
    rope: int  # this layer's RoPE frequencies: DecodeWeights.rope_freqs[rope]

    def __post_init__(self) -> None:
        norms = [self.input_norm, self.post_norm, *(self.ffn_norms or ())]
        if len({norm.eps for norm in norms}) > 1 or (self.qk_norms and self.qk_norms[0].eps != self.qk_norms[1].eps):
            raise ValueError("decode step: a layer's norms have different epsilons")

    @property
    def linears(self) -> tuple[DecodeLinear, DecodeLinear, DecodeLinear, DecodeLinear]:
        """qkv, o, gate_up, down: decode_layer's (and avx2.c's) order."""
        return self.qkv, self.o, self.gate_up, self.down

    def arguments(self) -> tuple:
        """decode_layer's weight arguments, in its order (built once)."""
        linears = self.linears
        pad_rows = max(lin.pad_rows for lin in linears)
        ffn_norms = [norm.weight for norm in self.ffn_norms] if self.ffn_norms else None
        qk_norms = [norm.weight for norm in self.qk_norms] if self.qk_norms else []
        return ([self.input_norm.weight, self.post_norm.weight], self.input_norm.eps, ffn_norms,
                [lin.kind for lin in linears], [lin.tensors for lin in linears], pad_rows, self.activation,
                self.qkv_bias, qk_norms, self.qk_norms[0].eps if self.qk_norms else 0.0)


@dataclass
class DecodeWeights:
    """The model's weights in one decode kernel's form (built once per engine)."""

    kernel: str
    layers: list[DecodeLayer]
    lm_head: DecodeLinear
    final_norm: Norm
    intermediate: int  # MLP width: gate_up's first half is the gate
    rope_freqs: list[torch.Tensor]  # the distinct RoPE frequency tables [D/2] (Gemma 3: local, global)
    arguments: list[tuple] = field(init=False)  # per layer: DecodeLayer.arguments(), derived from `layers`
    native: list[avx2.NativeLayer] | None = None  # avx2: each layer as one C call
    note: str = ""  # why the kernel asked for is not the one used

    def __post_init__(self) -> None:
        self.arguments = [layer.arguments() for layer in self.layers]

    def kernels_used(self) -> dict[str, int]:
        """How many matrices each kernel serves (a matrix that does not pack exactly falls back to fp32)."""
        counts: dict[str, int] = {}
        for lin in [self.lm_head] + [m for layer in self.layers for m in layer.linears]:
            counts[lin.kernel] = counts.get(lin.kernel, 0) + 1
        return counts


def build_decode_weights(runner, kernel: str, pad_rows: int) -> DecodeWeights:
    """The model's weights in `kernel`'s form; avx2 where it can serve the model, else int4 (with a note)."""
    refusal = native_refusal(runner) if kernel == "avx2" else None
    weights = _weights(runner, "int4" if refusal else kernel, pad_rows)
    if kernel == "avx2" and not refusal:
        if all(isinstance(m, Avx2Linear) for layer in weights.layers for m in layer.linears):
            weights.native = [native_layer(runner, layer) for layer in weights.layers]
            return weights
        refusal = "a layer matrix is not exact Q4_1 or Q8_0 blocks"
        weights = _weights(runner, "int4", pad_rows)
    if refusal:
        weights.note = f"avx2 decode kernel not used: {refusal}; decoding with int4"
        log.warning(weights.note)
    return weights


def native_refusal(runner) -> str | None:
    """Why avx2.c's layer cannot decode this model here (it runs the plain Llama layer in fp32), or None."""
    if (reason := avx2.unavailable()) is not None:
        return reason
    if runner.device.type != "cpu" or runner.dtype != torch.float32:
        return f"the model is {runner.dtype} on {runner.device.type}, not fp32 on the CPU"
    windows = any(w is not None for w in runner.windows)
    if runner.sandwich_norms or windows or mlp_activation(runner.model.config) != SILU:
        return "the layers are not the plain Llama form (sandwich norms, sliding windows or another activation)"
    attn = runner.layers[0].self_attn
    if attn.q_proj.bias is not None or getattr(attn, "q_norm", None) is not None:
        return "the attention has q/k/v biases or q/k norms"
    return avx2.shape_refusal(_native_shape(runner))


def _native_shape(runner) -> avx2.Shape:
    shape = runner.shape
    return avx2.Shape(shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                      runner.layers[0].mlp.gate_proj.weight.shape[0])


def native_layer(runner, layer: DecodeLayer) -> avx2.NativeLayer:
    return avx2.NativeLayer(_native_shape(runner), (layer.input_norm.weight, layer.post_norm.weight),
                            layer.input_norm.eps, layer.scaling,
                            tuple(m.blocks for m in layer.linears))


def _weights(runner, kernel: str, pad_rows: int) -> DecodeWeights:
    make = DECODE_KERNELS[kernel]
    activation = mlp_activation(runner.model.config)
    layers = []
    for index, block in enumerate(runner.layers):
        check_servable(block)
        attn, mlp = block.self_attn, block.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach().float()
        qk_norms = (Norm.of(attn.q_norm), Norm.of(attn.k_norm)) if getattr(attn, "q_norm", None) is not None else None
        ffn_norms = None
        if runner.sandwich_norms:
            ffn_norms = (Norm.of(block.pre_feedforward_layernorm), Norm.of(block.post_feedforward_layernorm))
        layers.append(DecodeLayer(make(qkv, pad_rows), bias, make(attn.o_proj.weight, pad_rows),
                                  make(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), pad_rows),
                                  make(mlp.down_proj.weight, pad_rows), Norm.of(block.input_layernorm),
                                  Norm.of(block.post_attention_layernorm), float(attn.scaling), qk_norms, ffn_norms,
                                  activation, runner.windows[index], runner.rope.index[index]))
    return DecodeWeights(kernel, layers, make(runner.model.lm_head.weight, pad_rows), Norm.of(runner.model.model.norm),
                         runner.layers[0].mlp.gate_proj.weight.shape[0], list(runner.rope.tables))


def mlp_activation(config) -> int:
    """The config's MLP activation as decode_layer's code (Gemma 3 names it hidden_activation)."""
    name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if name not in ACTIVATIONS:
        raise ValueError(f"decode step: MLP activation {name!r} is not one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def check_servable(block: torch.nn.Module) -> None:
    """Refuse a layer decode_layer would compute differently: biases other than q/k/v's, a gateless MLP."""
    attn, mlp = block.self_attn, block.mlp
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
        raise ValueError(f"decode step: {type(mlp).__name__} is not a gated MLP (gate_proj, up_proj, down_proj)")
    for name, linear in (("o_proj", attn.o_proj), ("gate_proj", mlp.gate_proj), ("up_proj", mlp.up_proj),
                         ("down_proj", mlp.down_proj)):
        if linear.bias is not None:
            raise ValueError(f"decode step: {name} has a bias")


@torch.inference_mode()
def decode_step(runner, weights: DecodeWeights, token_ids: Sequence[int], positions: Sequence[int],
                caches: Sequence[KVCache], observers: Sequence | None = None, layer_fn=decode_layer) -> torch.Tensor:
    """Row b: token_ids[b] at positions[b] appended to caches[b] -> logits [B, vocab] (fp32).

    observers[b] (or None) sees row b's queries and KV per layer, as in ModelRunner.forward (after
    the layer: attention only reads the cache). `layer_fn` is decode_layer (scripted) or
    decode_layer_eager (the same source)."""
    shape, device = runner.shape, runner.device
    rows, heads, kv_heads, head_dim = len(token_ids), shape.num_heads, shape.num_kv_heads, shape.head_dim
    observers = observers or [None] * rows
    positions = [int(p) for p in positions]
    pos = torch.tensor(positions, device=device)  # [B]
    row_pos = [pos[b:b + 1] for b in range(rows)]
    hidden = runner.embed(torch.tensor(list(token_ids), device=device))  # [B, hidden]
    if weights.native is not None:  # avx2.c: RoPE as cos/sin rows [B, D] per table
        rotations = [tuple((t * runner.rope_scale).contiguous() for t in rope_cos_sin(pos, freqs.to(device)))
                     for freqs in weights.rope_freqs]
    else:
        rotations = [rope_matrix(pos, freqs.to(device), runner.rope_scale).to(hidden.dtype)  # per table [B, D, D]
                     for freqs in weights.rope_freqs]
    shared = native_rows(caches, positions, hidden.dtype, rotations) if weights.native else None
    for index, (layer, arguments) in enumerate(zip(weights.layers, weights.arguments)):
        kvs = [cache.layers[index] for cache in caches]
        if weights.native is not None:
            q = native_layer_step(weights.native[index], index, hidden, kvs, positions, row_pos, layer.window,
                                  rotations[layer.rope], shared)
        else:
            slots = [kv.reserve(row_pos[b], hidden.dtype, hidden.dtype) for b, kv in enumerate(kvs)]
            masks = [visible_entries(kv, p, layer.window) for kv, p in zip(kvs, positions)]
            q = layer_fn(hidden, rotations[layer.rope], *arguments, heads, kv_heads, head_dim,
                         weights.intermediate, layer.scaling, [kv.keys for kv in kvs], [kv.values for kv in kvs],
                         masks, [slot[0] for slot in slots], [slot[1] for slot in slots])
        for b, observer in enumerate(observers):
            if observer is not None:
                observer(index, q[b][:, None], row_pos[b], kvs[b])
    return weights.lm_head(weights.final_norm(hidden)).float()


def native_rows(caches: Sequence[KVCache], positions: list[int], dtype: torch.dtype,
                rotations: list[tuple]) -> list:
    """Per row, avx2.c's record of its cache for every layer at once, or None (the row goes layer by layer).
    A row whose layers all grow together (KVCache.grow: one buffer, no head masks) is one record over layer 0
    that the C layer moves by the layer stride: one record a row a step instead of one a layer. avx2.c serves
    plain Llama layers only (native_refusal): one RoPE table, no sliding window."""
    (cos, sin), shared = rotations[0], []
    for b, (cache, position) in enumerate(zip(caches, positions)):
        stride = cache.layer_stride() if cache.grow(position, dtype) else None
        shared.append(None if stride is None else avx2.row(cache.layers[0], None, cos, sin, b, stride))
    return shared


def native_layer_step(native: avx2.NativeLayer, index: int, hidden: torch.Tensor, kvs: list[LayerKV],
                      positions: list[int], row_pos: list[torch.Tensor], window: int | None, rotation: tuple,
                      shared: list) -> torch.Tensor:
    """Layer `index` through avx2.c -> queries [B, Hq, D]. A row with a `shared` record has grown already
    (native_rows); the others grow by their token here (in place where they can, LayerKV.grow) and get this
    layer's record. avx2.c writes the new entries. rotation: cos, sin [B, D]."""
    cos, sin = rotation
    rows = list(shared)
    for b, kv in enumerate(kvs):
        if rows[b] is None:
            if not kv.grow(positions[b], hidden.dtype):
                kv.reserve(row_pos[b], hidden.dtype, hidden.dtype)
            rows[b] = avx2.row(kv, visible_entries(kv, positions[b], window), cos, sin, b)
    return native(hidden, rows, index)


def visible_entries(kv: LayerKV, position: int, window: int | None) -> torch.Tensor | None:
    """[Hkv, T] bool: the entries the newest token (at `position`, already in `kv`) sees: its own kv
    head's (head_mask) within the sliding window. None when it sees them all. No window mask while the
    window reaches back to position 0: it covers the whole cache."""
    if window is None or position < window:
        return kv.head_mask
    inside = (kv.positions > position - window).expand(kv.kv_heads, -1)  # [T] or [Hkv, T] -> [Hkv, T]
    return inside if kv.head_mask is None else inside & kv.head_mask


def rope_matrix(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """positions [B] -> R [B, D, D] with x @ R[b] == apply_rope(x, cos[b], sin[b]): RoPE as one matmul.

    Column j takes x_j cos_j and, from its pair in the other half, -x_(j+D/2) sin_j (j < D/2) or
    +x_(j-D/2) sin_j."""
    cos, sin = rope_cos_sin(positions, inv_freq)  # [B, D]
    cos, sin = cos * scale, sin * scale
    rows, dim = cos.shape
    half = dim // 2
    rotation = torch.diag_embed(cos)
    j = torch.arange(half, device=positions.device)
    rotation[:, j + half, j] = -sin[:, :half]
    rotation[:, j, j + half] = sin[:, half:]
    return rotation
