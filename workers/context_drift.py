"""Context drift: the mean shift of a stored chunk's K/V inside a prompt, measured once per model.

A stored chunk was computed after a fixed lead-in (workers/chunk_forms.py), not after the chunks a
prompt puts before it. Measured on the quality suite's `dev` split (research/blend.md, "Shift, then blend"):
the filler of the chunks that do not hold the answer then pulls the question's attention, and
shifting every stored chunk entry by the mean drift before blend chooses its tokens removes most
of that (blend's deviation check then measures what the mean does not explain). The drift of a
(layer, kv head) points the same way across chunks and prompts (cosine 0.8-0.98), so it is
measured once per model, on fixed prompts (the sample documents cut into 128-token chunks, eight
to a prompt, three draws per sample question), for the first chunk of a prompt and for the later
ones, and stored next to the model's converted copy like the key plan.

Keys are shifted before RoPE (each entry's shift rotated to its position), values as they are. The shift is
added to each chunk as it is placed, in the same pass as its rotation and copy (workers/placement.py; `drifted`
is the same shift as a torch op, in the chunk's own frame, which the placing rotation carries on).
Shapes: 2 slots (first chunk, later chunks), L layers, H kv heads, T tokens, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from tqdm import tqdm

from kvstore.kv import ChunkKV
from kvstore.rope import apply_rope, rerotate_keys, rope_cos_sin
from workers.cache import KVCache
from workers.chunk_forms import DEFAULT_CHUNK_FORM, compute_chunk
from workers.model import beside_model, measured_record
from workers.prompt import build_prompt
from workers.samples import sample_documents, sample_questions

CHUNK_TOKENS = 128  # the sample documents are cut into chunks of this many tokens
PROMPT_CHUNKS = 8
DRAWS = 3  # prompts per sample question, each a seeded draw of PROMPT_CHUNKS chunks
DRIFT_VERSION = 1


@dataclass(frozen=True)
class ContextDrift:
    keys: torch.Tensor  # [2, L, H, D] fp32, pre-RoPE: slot 0 = a prompt's first chunk, 1 = the later ones
    values: torch.Tensor  # [2, L, H, D] fp32


def chunk_slots(count: int, first: bool) -> list[int]:
    """Each of `count` placed chunks' drift slot: 0 for the prompt's first chunk (`first`: the first placed chunk
    is the prompt's first, not one after an exact head), 1 for the later ones."""
    return [0 if first and j == 0 else 1 for j in range(count)]


def drifted(chunk: ChunkKV, slot: int, drift: ContextDrift, inv_freq: torch.Tensor | None = None) -> ChunkKV:
    """`chunk` with its slot's drift added, in the chunk's own frame, so that placing it (ChunkKV.keys_at) rotates
    the drift on with the keys: a key placed at p becomes R(p) (k + d), the stored key shifted before RoPE.

    Pre-RoPE keys take the drift as it is; post-RoPE keys (rotated at their positions in the chunk: 0..n-1, or a
    compressed chunk's own) take it rotated to those positions. Values take it as it is. One pass over the
    chunk, instead of a pass over every layer of the prompt's cache afterwards.
    Shapes: keys/values [L, H, T, D]; drift [2, L, H, D] -> the slot's [L, H, 1, D]."""
    device = chunk.keys.device
    keys = drift.keys[slot].to(device)[:, :, None, :]  # [L, H, 1, D] fp32, pre-RoPE
    values = drift.values[slot].to(device)[:, :, None, :]
    if not chunk.pre_rope:
        freq = chunk.inv_freq if chunk.inv_freq is not None else inv_freq
        if freq is None:
            raise ValueError("shifting post-RoPE keys needs inv_freq")
        # [T, D], [L, H, T, D] for a compressed chunk, [L, 1, T, D] for per-layer frequencies
        cos, sin = rope_cos_sin(chunk.slot_positions(device), freq.to(device))
        keys = apply_rope(keys, cos, sin)  # [L, H, T, D]
    return replace(chunk, keys=(chunk.keys + keys).to(chunk.keys.dtype),
                   values=(chunk.values + values).to(chunk.values.dtype))


def _sample_chunks(runner) -> list[list[int]]:
    docs = [runner.tokenize(text) for text in sample_documents().values()]
    return [d[i:i + CHUNK_TOKENS] for d in docs for i in range(0, len(d) - CHUNK_TOKENS // 2, CHUNK_TOKENS)]


@torch.inference_mode()
def measure(runner, form: str = DEFAULT_CHUNK_FORM) -> ContextDrift:
    """Mean over the sample prompts of (in-prompt - stored) K/V per chunk slot, layer and kv head."""
    shape = runner.shape
    chunks = _sample_chunks(runner)
    stored: dict[int, object] = {}  # chunk index -> its stored form's KV (keys rotated at 0..n-1), as drawn
    sums = torch.zeros(2, 2, shape.num_layers, shape.num_kv_heads, shape.head_dim)  # [K/V, slot, L, H, D]
    counts = torch.zeros(2)
    generator = torch.Generator().manual_seed(0)
    draws = [(q, torch.randperm(len(chunks), generator=generator)[:PROMPT_CHUNKS].tolist())
             for q in sample_questions() for _ in range(DRAWS)]
    for sample, pick in tqdm(draws, desc="context drift (once per model)", leave=False):
        layout = build_prompt(runner.tokenizer, "", [chunks[i] for i in pick], sample.question)
        cache = KVCache.empty(shape.num_layers)
        runner.forward(torch.tensor(layout.token_ids, device=runner.device),
                       torch.arange(layout.num_tokens, device=runner.device), cache)
        for j, ((start, end), i) in enumerate(zip(layout.chunk_spans, pick)):
            slot, local = min(j, 1), torch.arange(end - start)
            if i not in stored:
                stored[i] = compute_chunk(runner, chunks[i], form)
            for layer, kv in enumerate(cache.layers):
                freq = runner.layer_inv_freq(layer)
                true_keys = rerotate_keys(kv.keys[:, start:end].float().cpu(), -kv.positions[start:end].cpu(), freq)
                own_keys = rerotate_keys(stored[i].keys[layer].float().cpu(), -local, freq)
                sums[0, slot, layer] += (true_keys - own_keys).mean(dim=1)
                sums[1, slot, layer] += (kv.values[:, start:end].float().cpu() - stored[i].values[layer].float().cpu()).mean(dim=1)
            counts[slot] += 1
    means = sums / counts[None, :, None, None, None]
    return ContextDrift(keys=means[0], values=means[1])


def drift_path(runner, form: str):
    return beside_model(runner, f"ragkv-context-drift-{form}.json", "context-drift")


_DRIFTS: dict[tuple[str, str], ContextDrift] = {}  # (fingerprint, form) -> drift, read or measured in this process


def context_drift(runner, form: str = DEFAULT_CHUNK_FORM) -> ContextDrift:
    """The model's drift for chunks of `form`: this process's copy, else the stored file when it matches,
    else measured (~30 s on 2 CPU cores for the default model) and stored."""
    key = (runner.fingerprint, form)
    if key not in _DRIFTS:
        identity = {"version": DRIFT_VERSION, "fingerprint": runner.fingerprint, "form": form}
        record = measured_record(drift_path(runner, form), identity, lambda: _measure_record(runner, form))
        _DRIFTS[key] = ContextDrift(keys=torch.tensor(record["keys"]), values=torch.tensor(record["values"]))
    return _DRIFTS[key]


def _measure_record(runner, form: str) -> dict:
    drift = measure(runner, form)
    return {"keys": drift.keys.tolist(), "values": drift.values.tolist()}
