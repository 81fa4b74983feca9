"""LoRA adapters: seeded weights, a content id, and a peft-wrapped copy of the base model.

An adapter is plain data (per-layer, per-projection A [r, in] and B [out, r] plus the
scaling alpha / r). Its id is a sha256 over its config and weight bytes, so it can go
into content addresses. `AdapterModels` deep-copies the runner's model once, wraps the
copy with peft, loads every adapter into it by name, and hands out a ModelRunner over
the copy with one adapter active; the runner's own model is never touched.
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct
from dataclasses import dataclass, field

import torch

from workers.model import LoadedModel
from workers.runner import ModelRunner

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class LoraAdapter:
    rank: int
    alpha: float
    targets: tuple[str, ...]
    # (layer, module) -> (A [r, in], B [out, r]), fp32 on CPU
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def a(self, layer: int, module: str) -> torch.Tensor:
        return self.weights[(layer, module)][0]

    def b(self, layer: int, module: str) -> torch.Tensor:
        return self.weights[(layer, module)][1]

    @property
    def adapter_id(self) -> str:
        """sha256 over (rank, alpha, targets) and every weight's bytes in a canonical order."""
        h = hashlib.sha256(b"ragkv/lora/v1")
        config = json.dumps({"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}, sort_keys=True)
        h.update(config.encode())
        for (layer, module) in sorted(self.weights):
            for t in self.weights[(layer, module)]:
                data = t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()
                h.update(struct.pack("<IQ", layer, len(data)) + module.encode() + data)
        return h.hexdigest()

    def zeroed_b(self) -> "LoraAdapter":
        """Same A, B = 0: the adapter model equals the base model."""
        return LoraAdapter(self.rank, self.alpha, self.targets,
                           {k: (a, torch.zeros_like(b)) for k, (a, b) in self.weights.items()})


def random_adapter(runner: ModelRunner, rank: int, seed: int, rel_scale: float = 0.05, alpha: float | None = None,
                   targets: tuple[str, ...] = TARGETS) -> LoraAdapter:
    """Seeded adapter of realistic scale: A ~ U(+-1/sqrt(in)) (peft's kaiming init), B ~ N(0, sigma).

    sigma is set per projection so that ||scaling * B A||_F = rel_scale * ||W||_F: the adapter
    changes each projection by about `rel_scale` of its size (fine-tuned LoRAs are usually a few
    percent of W; `ragkv bench lora` reports how often the adapter changes the base model's answer).
    """
    gen = torch.Generator().manual_seed(seed)
    alpha = float(alpha if alpha is not None else 2 * rank)
    scaling = alpha / rank
    weights = {}
    for layer, block in enumerate(runner.layers):
        for module in targets:
            w = getattr(block.self_attn, module).weight.detach().float().cpu()  # [out, in]
            out_dim, in_dim = w.shape
            a = (torch.rand(rank, in_dim, generator=gen) * 2 - 1) / in_dim ** 0.5
            b = torch.randn(out_dim, rank, generator=gen)
            b *= rel_scale * w.norm() / (scaling * (b @ a).norm())
            weights[(layer, module)] = (a, b)
    return LoraAdapter(rank, alpha, tuple(targets), weights)


class AdapterModels:
    """A peft-wrapped deep copy of the runner's model holding many adapters; one active at a time."""

    def __init__(self, runner: ModelRunner, adapters: list[LoraAdapter]):
        from peft import LoraConfig, get_peft_model

        if not adapters:
            raise ValueError("at least one adapter is required")
        self.base = runner
        self.adapters = {a.adapter_id: a for a in adapters}
        model = copy.deepcopy(runner.model)  # the runner's model is shared: adapters go on a copy
        self.peft = None
        for adapter_id, adapter in self.adapters.items():
            config = LoraConfig(r=adapter.rank, lora_alpha=adapter.alpha, target_modules=list(adapter.targets),
                                lora_dropout=0.0, bias="none")
            if self.peft is None:
                self.peft = get_peft_model(model, config, adapter_name=_name(adapter_id))
            else:
                self.peft.add_adapter(_name(adapter_id), config)
            self._load_weights(adapter_id, adapter)
        self.peft.eval()
        inner = self.peft.base_model.model  # the LlamaForCausalLM inside, its projections now LoRA layers
        self.runner = ModelRunner(LoadedModel(model=inner, tokenizer=runner.tokenizer,
                                              fingerprint=runner.fingerprint, source=runner.loaded.source))

    @torch.no_grad()
    def _load_weights(self, adapter_id: str, adapter: LoraAdapter) -> None:
        name = _name(adapter_id)
        for layer, block in enumerate(self.peft.base_model.model.model.layers):
            for module in adapter.targets:
                lora = getattr(block.self_attn, module)
                lora.lora_A[name].weight.copy_(adapter.a(layer, module))
                lora.lora_B[name].weight.copy_(adapter.b(layer, module))

    def runner_for(self, adapter: LoraAdapter) -> ModelRunner:
        """The runner over the copy, with only this adapter active."""
        if adapter.adapter_id not in self.adapters:
            raise KeyError(f"adapter {adapter.adapter_id[:16]} is not loaded")
        self.peft.base_model.set_adapter(_name(adapter.adapter_id))
        return self.runner


def _name(adapter_id: str) -> str:
    return f"a{adapter_id[:16]}"
