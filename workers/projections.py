"""Prefill kernels: how a decoder layer's projections (q/k/v, o, the MLP) run over a prompt, by name.

A prefill pushes S tokens through every weight matrix: S x 2 x 135M multiply-adds for the default
model, so on a CPU it is bound by arithmetic, not by reading the weights. Two kernels:

    fp32   the model's own modules (nn.Linear in fp32): exactly what transformers computes.
    bf16   the same weights cast to bf16 once (the LM head's too; held in oneDNN's packed layout where the
           CPU has native bf16: Bf16Matrix), bf16 activations, fp32 accumulation and outputs.
           On a CPU with AVX512-BF16 (the 2-core box) a projection takes about a third of fp32's
           time (measured: 3072x576 at 26 rows 0.39 against 1.31 ms; at 200 rows 1.5 against 6.1).
           The default model's weights are 4-bit (GGUF Q4_1), which the decode step already runs
           with bf16 activations (workers/batching/linear.py).

Activations leave each projection in fp32, so norms, RoPE and the residual stream stay fp32 under both.
Attention stays fp32 under both; a third kernel, bf16-attention, is bf16 with attention in bf16 arithmetic as
well on a CPU with AVX512-BF16 (queries, keys, values and softmax weights rounded to bf16, sums in fp32:
`attention_bf16`). A kernel is part of what a KV block's bytes depend on: `kernel_fingerprint` (the runner's `kv_fingerprint`)
goes into the content address (workers/chunk_forms.py).

The default, `auto`, is bf16-attention on a CPU with AVX512-BF16 (chosen on the quality suite's dev split,
120 prompts: answers as bf16's within noise, a prefill 6-13% faster; docs/benchmarks.md, twelfth session), bf16
where the hardware multiplies bf16 natively otherwise (an AMX CPU without it, a CUDA GPU with bf16) and fp32
elsewhere: on an AVX2-only CPU torch emulates bf16 and the same
576 x 1536 projection over 1,024 rows took 2.16 s against fp32's 0.029 s (measured 2026-12-03 on an
AVX2 EPYC box), which turned a 10-minute quality run into an hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from transformers.activations import SiLUActivation

from kvstore.registry import registrar

SILU_MODULES = (torch.nn.SiLU, SiLUActivation)  # activations whose forward is F.silu, run in place by the bf16 MLP

PREFILL_KERNELS: dict[str, Callable[[list], "Projections"]] = {}
AUTO = "auto"  # not a kernel: bf16(-attention) where the device multiplies bf16 natively, else fp32 (resolve_prefill_kernel)
DEFAULT_PREFILL_KERNEL = AUTO  # bf16 and bf16-attention chosen on the quality suite's dev split (docs/benchmarks.md)
EXACT_PREFILL_KERNEL = "fp32"  # transformers' own arithmetic


prefill_kernel = registrar(PREFILL_KERNELS, "prefill kernel")


def prefill_kernel_names() -> tuple[str, ...]:
    """What --prefill-kernel accepts: `auto` and every registered kernel."""
    return (AUTO, *PREFILL_KERNELS)


def check_prefill_kernel(name: str) -> str:
    if name not in prefill_kernel_names():
        raise ValueError(f"--prefill-kernel: unknown kernel {name!r}; expected one of {', '.join(prefill_kernel_names())}")
    return name


def native_bf16(device: torch.device | str) -> bool:
    """Does `device` multiply bf16 in hardware (rather than emulate it, far slower than fp32)?"""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":  # torch.cpu's feature probes (AVX512-BF16, AMX tiles)
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def resolve_prefill_kernel(name: str, device: torch.device | str | None = None) -> str:
    """A registered kernel's name as it is; `auto` -> bf16-attention on a CPU with AVX512-BF16, bf16 where
    `device` (None: CUDA when present, else the CPU, as ModelRunner.load picks) multiplies bf16 natively
    otherwise, else fp32."""
    if check_prefill_kernel(name) != AUTO:
        return name
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if not native_bf16(device):
        return EXACT_PREFILL_KERNEL
    return "bf16-attention" if device.type == "cpu" and torch.cpu._is_avx512_bf16_supported() else "bf16"


def kernel_fingerprint(fingerprint: str, kernel: str) -> str:
    """The model fingerprint extended by the prefill kernel (the exact one leaves it as it is; `auto` is
    resolved first): a KV block's bytes depend on both, and its content address is built on this."""
    tag = PREFILL_KERNELS[resolve_prefill_kernel(kernel)].fingerprint_tag
    return f"{fingerprint}+{tag}" if tag else fingerprint


class Projections:
    """The projections of every decoder layer: x [S, in] fp32 -> [S, out] fp32."""

    attention_bf16 = False  # attention in bf16 arithmetic where the CPU has it (workers/row_attention.py)
    fingerprint_tag = ""  # what kernel_fingerprint appends (the exact kernel: nothing)

    def qkv(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> q [S, Hq * D], k [S, Hkv * D], v [S, Hkv * D]."""
        raise NotImplementedError

    def kv(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> k [S, Hkv * D], v [S, Hkv * D]: qkv's k and v, bit for bit, without computing q."""
        raise NotImplementedError

    def o(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head: x [S, hidden] (after the final norm) -> logits [S, vocab] fp32."""
        raise NotImplementedError


@prefill_kernel("fp32")
class ModuleProjections(Projections):
    """The model's modules themselves (LoRA layers included, when an adapter wraps them)."""

    def __init__(self, blocks, lm_head: torch.nn.Module):
        self.blocks, self.lm_head = blocks, lm_head

    def qkv(self, layer, x):
        attn = self.blocks[layer].self_attn
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    def kv(self, layer, x):
        attn = self.blocks[layer].self_attn
        return attn.k_proj(x), attn.v_proj(x)

    def o(self, layer, x):
        return self.blocks[layer].self_attn.o_proj(x)

    def mlp(self, layer, x):
        return self.blocks[layer].mlp(x)

    def head(self, x):
        return self.lm_head(x).float()


@prefill_kernel("bf16")
class Bf16Projections(Projections):
    """Weights cast to bf16 once (q|k|v and gate|up concatenated: one matmul each), the LM head's too."""

    fingerprint_tag = "bf16"

    def __init__(self, blocks, lm_head: torch.nn.Module):
        for block in blocks:
            if any(type(m) is not torch.nn.Linear for m in _linears(block)):
                raise ValueError("--prefill-kernel bf16: the model's projections are not plain nn.Linear "
                                 f"(found {type(block.self_attn.q_proj).__name__}); use fp32")
        self.layers = [_Bf16Layer.of(block) for block in blocks]
        plain = type(lm_head) is torch.nn.Linear and lm_head.bias is None
        self.lm_head = Bf16Matrix.of(lm_head) if plain else lm_head  # else the module's own arithmetic

    def qkv(self, layer, x):
        lay = self.layers[layer]
        out = lay.qkv(x.to(torch.bfloat16)).float()  # [S, (Hq + 2 Hkv) D]
        if lay.qkv_bias is not None:
            out = out + lay.qkv_bias
        return out.split(lay.qkv_sizes, dim=-1)

    def kv(self, layer, x):
        lay = self.layers[layer]
        out = lay.kv(x.to(torch.bfloat16)).float()  # [S, 2 Hkv D]: the k|v rows, packed on their own
        if lay.qkv_bias is not None:
            out = out + lay.qkv_bias[lay.qkv_sizes[0]:]
        return out.split(lay.qkv_sizes[1:], dim=-1)

    def o(self, layer, x):
        return self.layers[layer].o(x.to(torch.bfloat16)).float()

    def mlp(self, layer, x):
        lay = self.layers[layer]
        gate_up = lay.gate_up(x.to(torch.bfloat16)).float()  # [S, 2 I]
        gate, up = gate_up.chunk(2, dim=-1)
        # in place, in the fp32 copy: the same kernels and bits as act(gate) * up, two [S, I] buffers fewer
        # (1,116 rows: 2.2-2.5 against 1.4-1.8 ms a layer)
        return lay.down(_act_in_place(lay.act, gate).mul_(up).to(torch.bfloat16)).float()

    def head(self, x):
        if isinstance(self.lm_head, Bf16Matrix):
            return self.lm_head(x.to(torch.bfloat16)).float()
        return self.lm_head(x).float()


@prefill_kernel("bf16-attention")
class Bf16AttentionProjections(Bf16Projections):
    """bf16's projections, and attention in bf16 arithmetic too on a CPU with AVX512-BF16 (workers/row_attention.c:
    1.55-1.6x the fp32 row kernel; a prefill 6-13% faster), fp32 elsewhere. `auto` on such a CPU."""

    attention_bf16 = True
    fingerprint_tag = "bf16-attention"


@dataclass(frozen=True)
class Bf16Matrix:
    """A weight [out, in] cast to bf16 once: x [S, in] bf16 -> x @ weight.T [S, out] bf16 (fp32 accumulation).

    Where the CPU multiplies bf16 natively, the weight is held in oneDNN's own blocked layout, packed once
    (`torch.ops.mkldnn._reorder_linear_weight`, what inductor's weight freezing uses): `F.linear` on a plain
    weight reorders it at every call, which a prefill over a few rows pays in full (measured on the AVX512-BF16
    box, 576 -> 3072: 2.4x faster at 1 row, ~1.2x at 25, ~1.05-1.1x at 185-1,116). The products are the same
    bit for bit (tests/workers/test_projections.py). Elsewhere (CUDA, a CPU that emulates bf16) the plain
    weight and F.linear."""

    weight: torch.Tensor  # [out, in] bf16: plain, or oneDNN's packed layout (`packed`)
    packed: bool

    @classmethod
    def of(cls, linear: torch.nn.Linear) -> "Bf16Matrix":
        return cls.cast(linear.weight)

    @classmethod
    def cast(cls, weight: torch.Tensor) -> "Bf16Matrix":
        weight = weight.detach().to(torch.bfloat16).contiguous()
        if weight.device.type == "cpu" and torch.backends.mkldnn.is_available() and native_bf16("cpu"):
            try:
                return cls(torch.ops.mkldnn._reorder_linear_weight(weight), True)
            except RuntimeError:  # a oneDNN build without this layout: the plain weight computes the same
                pass
        return cls(weight, False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        return F.linear(x, self.weight)


@dataclass
class _Bf16Layer:
    qkv: Bf16Matrix  # [(Hq + 2 Hkv) D, hidden]
    qkv_bias: torch.Tensor | None  # fp32 (Qwen2)
    qkv_sizes: list[int]  # rows of q, k, v
    kv: Bf16Matrix  # [2 Hkv D, hidden]: qkv's k|v rows again, for blend's choice of tokens (fresh K/V only)
    o: Bf16Matrix
    gate_up: Bf16Matrix  # [2 I, hidden]: gate rows first
    down: Bf16Matrix
    act: torch.nn.Module  # the MLP's own activation (SiLU; Gemma: GELU-tanh)

    @classmethod
    def of(cls, block) -> "_Bf16Layer":
        attn, mlp = block.self_attn, block.mlp
        if not isinstance(getattr(mlp, "act_fn", None), torch.nn.Module):
            raise ValueError(f"--prefill-kernel bf16: {type(mlp).__name__} has no act_fn module; use fp32")
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        bias = None
        if attn.q_proj.bias is not None:  # Qwen2
            bias = torch.cat([p.bias for p in projections]).detach().float()
        bf16 = lambda *ws: Bf16Matrix.cast(torch.cat([w.weight.detach() for w in ws]))  # noqa: E731
        return cls(bf16(*projections), bias, [p.weight.shape[0] for p in projections], bf16(*projections[1:]),
                   bf16(attn.o_proj),
                   bf16(mlp.gate_proj, mlp.up_proj), bf16(mlp.down_proj), mlp.act_fn)


def _act_in_place(act: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """act(x), written over x where the activation is SiLU (torch's module or transformers'), else a new tensor."""
    if isinstance(act, SILU_MODULES):
        return F.silu(x, inplace=True)
    return act(x)


def _linears(block) -> tuple:
    attn, mlp = block.self_attn, block.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj
