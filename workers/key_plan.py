"""A model's key-channel plan for `wk4v3` (kvstore/codecs/planned.py): which key channels get more bits.

Measured once per model on fixed prompts (each sample question over all the sample documents,
workers/samples.py): for each (layer, kv head, channel) the mean squared query of its GQA group over
every prompt token, summed over the channel's RoPE pair (RoPE turns the two together, so the pair
shares its energy), times the spread (std over tokens) of the pre-RoPE keys of the documents. That
is the weight of kvstore/codecs/allocation.py; `allocate` spends KEY_BITS a channel on average over
all layers and heads. The prompts are fixed and the pass is deterministic, so every process serving
the model makes the same plan, hence the same codec params and the same block addresses. The plan
is stored next to the model's converted copy (`ragkv-key-plan.json`) and reused.
"""

from __future__ import annotations

import dataclasses

import torch
from tqdm import tqdm

from kvstore.codecs import Codec, PlannedKeys, codec_from_spec
from kvstore.codecs.allocation import allocate, plan_string
from kvstore.rope import rerotate_keys
from workers.cache import KVCache
from workers.model import beside_model, measured_record
from workers.prompt import build_prompt
from workers.samples import sample_documents, sample_questions

KEY_BITS = 4.125  # mean width: keys 33 + 2 bytes a token and head at D = 64, so wk4v3 stays under 0.25 of fp16
SYSTEM_PROMPT = "You are a helpful assistant."
PLAN_VERSION = 2  # 2: the plan under "measured" (workers.model.measured_record)


def pair_energy(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [Hq, S, D] (after RoPE) -> [Hkv, D]: mean q^2 over the GQA group and the tokens, each channel
    given its RoPE pair's sum (channels c and c + D/2 turn together)."""
    heads, _, dim = q.shape
    energy = (q.float() ** 2).reshape(num_kv_heads, heads // num_kv_heads, -1, dim).mean(dim=(1, 2))
    pair = energy[:, : dim // 2] + energy[:, dim // 2:]
    return torch.cat([pair, pair], dim=-1)


@torch.inference_mode()
def key_weights(runner) -> torch.Tensor:
    """-> [L, Hkv, D]: E[q^2] (pair_energy) x std(pre-RoPE key)^2 over the sample prompts."""
    shape = runner.shape
    docs = [runner.tokenize(text) for text in sample_documents().values()]
    energy = torch.zeros(shape.num_layers, shape.num_kv_heads, shape.head_dim)
    spread = torch.zeros_like(energy)
    questions = sample_questions()
    for sample in tqdm(questions, desc="key plan for wk4v3 (once per model)", leave=False):
        layout = build_prompt(runner.tokenizer, SYSTEM_PROMPT, docs, sample.question)
        ids = torch.tensor(layout.token_ids, device=runner.device)
        positions = torch.arange(ids.numel(), device=runner.device)
        cache = KVCache.empty(shape.num_layers)

        def observe(layer, q, q_positions, kv):
            energy[layer] += pair_energy(q, shape.num_kv_heads).cpu()

        runner.forward(ids, positions, cache, observer=observe)
        start, end = layout.chunk_spans[0][0], layout.chunk_spans[-1][1]
        for layer, kv in enumerate(cache.layers):
            freq = runner.layer_inv_freq(layer)
            keys = rerotate_keys(kv.keys[:, start:end].float(), -positions[start:end], freq)  # [Hkv, T, D]
            spread[layer] += keys.std(dim=1).cpu()
    return energy / len(questions) * (spread / len(questions)) ** 2


def plan_path(runner):
    return beside_model(runner, "ragkv-key-plan.json", "key-plans")


_PLANS: dict[tuple[str, float], str] = {}  # (fingerprint, bits) -> plan, once read or measured in this process


def key_plan(runner, bits: float = KEY_BITS) -> str:
    """The model's plan (allocation.plan_string): this process's copy, else its stored file when that matches,
    else measured and stored."""
    key = (runner.fingerprint, bits)
    if key not in _PLANS:
        identity = {"version": PLAN_VERSION, "fingerprint": runner.fingerprint, "bits": bits}
        _PLANS[key] = measured_record(plan_path(runner), identity, lambda: _measure(runner, bits))["plan"]
    return _PLANS[key]


def _measure(runner, bits: float) -> dict:
    weights = key_weights(runner)
    return {"plan": plan_string(allocate(weights.flatten(), int(bits * weights.numel())).reshape(weights.shape))}


def needs_plan(codec: Codec) -> bool:
    return isinstance(codec, PlannedKeys) and not codec.key_plan


def planned_codec(spec, model: str) -> Codec:
    """codec_for_model for a process that has not loaded the model (the precompute driver): loads it only
    when the codec needs the plan and none is given."""
    codec = codec_from_spec(spec)
    if not needs_plan(codec):
        return codec
    from workers.runner import ModelRunner

    return codec_for_model(codec, ModelRunner.load(model))


def codec_for_model(spec, runner) -> Codec:
    """The codec of `spec` (a name, spec dict or Codec) for this model: a `wk4v3` without a plan gets the
    model's; every other codec is returned as is."""
    codec = codec_from_spec(spec)
    if needs_plan(codec):
        return dataclasses.replace(codec, key_plan=key_plan(runner))
    return codec
