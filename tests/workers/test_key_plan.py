"""The default model's key plan for wk4v3: measured once and stored, deterministic, and worth its bits."""

from __future__ import annotations

import json

import torch

from kvstore.codecs import make_codec
from kvstore.codecs.allocation import parse_plan
from kvstore.codecs.kivi import widths_codec
from kvstore.kv import ChunkKV
from kvstore.rope import rerotate_keys
from workers.attention import attend
from workers.cache import KVCache
from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.key_plan import KEY_BITS, codec_for_model, key_plan, pair_energy, plan_path
from workers.prompt import build_prompt
from workers.requests import GenerateRequest

CHUNKS = ("The harbour master of Pell keeps the tide tables; the north quay floods at spring tides.",
          "Access to the old signal tower needs the code 60418, which the harbour master changes each May.",
          "Ferries leave Pell for the islands twice a day, and the last one waits for the mail train.")
QUESTION = "What code opens the old signal tower?"


def test_plan_is_stored_reused_and_within_its_bits(runner):
    plan = key_plan(runner)
    shape = runner.shape
    widths = parse_plan(plan, (shape.num_layers, shape.num_kv_heads, shape.head_dim))
    assert float(widths.float().mean()) <= KEY_BITS and len(set(widths.flatten().tolist())) > 1
    record = json.loads(plan_path(runner).read_text())
    assert record["measured"]["plan"] == plan and record["fingerprint"] == runner.fingerprint
    assert key_plan(runner) == plan  # read back, not measured again (same inputs, same plan)


def test_codec_for_model_fills_only_a_missing_plan(runner):
    assert codec_for_model("wk4v3", runner).key_plan == key_plan(runner)
    explicit = make_codec("wk4v3", key_plan="4" * len(key_plan(runner)))
    assert codec_for_model(explicit, runner) is explicit
    assert codec_for_model("int8", runner) == make_codec("int8")


def test_pair_energy_shares_each_rope_pair():
    q = torch.zeros(6, 2, 8)  # 6 query heads over 3 kv heads, 2 tokens, D = 8
    q[0, :, 1] = 2.0  # kv head 0, channel 1: pairs with channel 5
    energy = pair_energy(q, 3)
    assert energy.shape == (3, 8) and energy[0, 1] == energy[0, 5] == 2.0 and float(energy[1:].abs().sum()) == 0


def _attention_error(runner, codec) -> float:
    """Relative error of the question's attention output over chunk keys stored through `codec` (values exact)."""
    layout = build_prompt(runner.tokenizer, "", [runner.tokenize(c) for c in CHUNKS], QUESTION)
    ids = torch.tensor(layout.token_ids)
    positions = torch.arange(ids.numel())
    queries = {}

    def observe(layer, q, q_positions, kv):
        queries[layer] = q[:, layout.suffix_start:].float()

    cache = KVCache.empty(runner.shape.num_layers)
    runner.forward(ids, positions, cache, observer=observe)
    start, end = layout.chunk_spans[0][0], layout.chunk_spans[-1][1]
    keys = torch.stack([kv.keys[:, start:end] for kv in cache.layers]).float()  # [L, H, T, D] at start..end-1
    keys = rerotate_keys(keys, -start, runner.inv_freq)  # a chunk's keys are stored as if at 0..n-1
    values = torch.stack([kv.values[:, start:end] for kv in cache.layers]).float()
    chunk = ChunkKV(keys, values, layout.token_ids[start:end], inv_freq=runner.inv_freq).with_rope(True)
    stored, _ = codec.decode(codec.encode(chunk.keys, chunk.values), tuple(keys.shape), torch.float32)
    placed = ChunkKV(stored, values, chunk.token_ids, inv_freq=runner.inv_freq, pre_rope=True).keys_at(start)
    err = ref = 0.0
    for layer, kv in enumerate(cache.layers):
        scale = runner.layers[layer].self_attn.scaling
        exact = attend(queries[layer], kv.keys.float(), kv.values.float(), positions[layout.suffix_start:],
                       kv.positions, scale)
        quantized_keys = kv.keys.float().clone()
        quantized_keys[:, start:end] = placed[layer]
        out = attend(queries[layer], quantized_keys, kv.values.float(), positions[layout.suffix_start:],
                     kv.positions, scale)
        err, ref = err + float(((out - exact) ** 2).sum()), ref + float((exact ** 2).sum())
    return (err / ref) ** 0.5


def test_the_plan_lowers_the_query_weighted_key_error(runner):
    """On a prompt outside the plan's sample prompts, at about the same bytes: the planned keys disturb the
    question's attention far less than 4 bits on every channel, rotated (hk4v3) or not.
    Measured (relative RMS over all layers): planned 0.0209, hk4v3 0.0336, 4 bits unrotated 0.0441; squared,
    2.6x and 4.5x less."""
    planned = _attention_error(runner, codec_for_model("wk4v3", runner))
    rotated = _attention_error(runner, widths_codec("hk4v3", 4, 3, True, "", key_group=128, value_group=64,
                                                       rotate=True)())  # research's hk4v3
    uniform = _attention_error(runner, make_codec("wk4v3"))
    assert planned < 0.75 * rotated and planned < 0.6 * uniform


def test_engine_serves_blend_over_planned_chunks(runner, tmp_path):
    engine = Engine(EngineConfig(store=f"disk:{tmp_path / 'blocks'}", codec="wk4v3", sequence_cache=False,
                                 blend=BlendConfig()),  # blended at the default ratio, over the stored chunks
                    runner=runner)  # the second answer over the same chunks is compared: no exact head
    try:
        assert engine.store.codec.key_plan == key_plan(runner)
        request = GenerateRequest(question=QUESTION, chunks=list(CHUNKS), mode="blend", max_new_tokens=12)
        first, again = engine.generate(request), engine.generate(request)
        assert again.stats["chunks_hit"] == len(CHUNKS) and again.text == first.text
    finally:
        engine.close()
