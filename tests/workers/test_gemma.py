"""Gemma 3 270M, the second named model, on the runner: transformers' logits, sliding windows that never see
past their window, per-layer RoPE in re-rotation and in stored blocks, the plain prompt template, and the
prefill pipeline's ratio 1 = full and ratio 0 = reuse. Prompts are longer than the 512-token window."""

import dataclasses

import pytest
import torch

from kvstore.block import decode_block, encode_block
from kvstore.codecs import make_codec
from workers.blend import BlendConfig
from workers.cache import KVCache
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.prompt import PLAIN_TEMPLATE, build_prompt
from workers.rope import rerotate_keys
from workers.selfcheck import check_rerotation

WINDOW = 512
SENTENCE = "The keeper of the north light logged {} ships passing the reef in the year {}. "


def _text(n: int, seed: int = 0) -> str:
    return "".join(SENTENCE.format(17 * i + seed, 1800 + i) for i in range(n))


@pytest.fixture(scope="module")
def long_ids(gemma_runner) -> list[int]:
    ids = [gemma_runner.tokenizer.bos_token_id] + gemma_runner.tokenize(_text(40))
    assert len(ids) > WINDOW + 100
    return ids


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_gemma_is_read_per_layer(gemma_runner):
    r = gemma_runner
    assert r.shape.num_layers == 18 and r.shape.num_kv_heads == 1 and r.shape.head_dim == 256
    assert r.windows == tuple(None if (i + 1) % 6 == 0 else WINDOW for i in range(18))  # 5 local : 1 global
    assert not torch.equal(r.layer_inv_freq(0), r.layer_inv_freq(5))  # bases 1e4 (local) and 1e6 (global)
    assert r.inv_freq.shape == (18, 1, 1, 128) and r.sandwich_norms and r.can_rerotate


def test_forward_equals_transformers_over_the_window(gemma_runner, long_ids):
    ids = torch.tensor(long_ids)
    with torch.inference_mode():
        reference = gemma_runner.model(ids[None]).logits[0].float()
    mine = gemma_runner.forward(ids, torch.arange(len(long_ids)), KVCache.empty(18), last_only=False)
    assert _relative(mine, reference) < 1e-4


def _next_logits(runner, cache: KVCache, token: int, position: int) -> torch.Tensor:
    view = KVCache([dataclasses.replace(kv, keys=kv.keys.clone(), values=kv.values.clone()) for kv in cache.layers])
    return runner.forward(torch.tensor([token]), torch.tensor([position]), view)


def _spoiled(cache: KVCache, layers, positions: slice) -> KVCache:
    layers = set(layers)
    spoiled = []
    for i, kv in enumerate(cache.layers):
        keys, values = kv.keys.clone(), kv.values.clone()
        if i in layers:
            keys[:, positions] = 1e3
            values[:, positions] = -1e3
        spoiled.append(dataclasses.replace(kv, keys=keys, values=values))
    return KVCache(spoiled)


def test_a_sliding_window_layer_never_attends_past_its_window(gemma_runner, long_ids):
    r, n = gemma_runner, len(long_ids)
    cache = KVCache.empty(18)
    r.forward(torch.tensor(long_ids), torch.arange(n), cache)
    token, local = long_ids[5], [i for i, w in enumerate(r.windows) if w]
    baseline = _next_logits(r, cache, token, n)  # the query at position n sees [n - 511, n] on local layers
    outside = slice(0, n - WINDOW + 1)
    assert torch.equal(_next_logits(r, _spoiled(cache, local, outside), token, n), baseline)
    inside = slice(n - WINDOW + 1, n - WINDOW + 20)  # the control: the same spoiling inside the window shows
    assert not torch.equal(_next_logits(r, _spoiled(cache, local, inside), token, n), baseline)
    global_layers = [i for i, w in enumerate(r.windows) if w is None]  # global layers see every position
    assert not torch.equal(_next_logits(r, _spoiled(cache, global_layers, outside), token, n), baseline)


@pytest.mark.parametrize("delta", [37, 1000])
def test_rerotation_is_exact_per_layer(gemma_runner, delta):
    assert check_rerotation(gemma_runner, delta=delta).passed
    keys = gemma_runner.chunk_kv(gemma_runner.tokenize(_text(2))).keys  # [L, 1, T, D] at 0..T-1
    one_table = rerotate_keys(keys, delta, gemma_runner.layer_inv_freq(0))  # the control: local bases everywhere
    per_layer = rerotate_keys(keys, delta, gemma_runner.inv_freq)
    assert torch.equal(per_layer[0], one_table[0]) and not torch.allclose(per_layer[5], one_table[5], atol=1e-3)


def test_a_pre_rope_block_keeps_each_layers_frequencies(gemma_runner):
    kv = gemma_runner.chunk_kv(gemma_runner.tokenize(_text(3)))
    torch.testing.assert_close(kv.with_rope(True).with_rope(False).keys, kv.keys, atol=1e-4, rtol=1e-4)
    decoded, _ = decode_block(encode_block(kv, make_codec("wk4v3"), gemma_runner.fingerprint))
    assert decoded.pre_rope and torch.equal(decoded.inv_freq, gemma_runner.inv_freq)
    assert _relative(decoded.keys_at(0).float(), kv.keys.float()) < 0.25  # 4-bit keys, rotated back per layer


def test_a_base_model_gets_the_plain_documents_then_question_template(gemma_runner):
    tok = gemma_runner.tokenizer
    assert tok.chat_template == PLAIN_TEMPLATE  # the GGUF has none
    chunks = [gemma_runner.tokenize("Alpha is 3."), gemma_runner.tokenize("Beta is 4.")]
    layout = build_prompt(tok, "Answer briefly.", chunks, "What is Beta?")
    assert layout.token_ids[0] == tok.bos_token_id
    assert [layout.token_ids[a:b] for a, b in layout.chunk_spans] == chunks
    assert tok.decode(layout.token_ids[1:]) == "Answer briefly.\n\nAlpha is 3.\n\nBeta is 4.\n\nWhat is Beta?\nAnswer:"


def _layout_and_chunks(runner):
    chunks = [runner.tokenize(_text(12, seed)) for seed in range(3)]  # ~3 x 200 tokens: past the window
    layout = build_prompt(runner.tokenizer, "", chunks, "How many ships did the keeper log in 1805?")
    held = HeldChunks(runner.chunk_kv(layout.prefix_ids), [runner.chunk_kv(c) for c in chunks])
    return layout, held


def test_ratio_one_is_full_and_ratio_zero_is_reuse(gemma_runner):
    layout, held = _layout_and_chunks(gemma_runner)
    assert layout.num_tokens > WINDOW
    full = run_prefill(gemma_runner, layout, plan_for("full", BlendConfig())).logits
    no_drift = BlendConfig(context_drift=False)  # the claims hold with or without it; its measurement is slow
    one = run_prefill(gemma_runner, layout, plan_for("blend", dataclasses.replace(no_drift, recompute_ratio=1.0)), held)
    assert _relative(one.logits, full) < 1e-3
    zero = run_prefill(gemma_runner, layout, plan_for("blend", dataclasses.replace(no_drift, recompute_ratio=0.0)), held)
    reuse = run_prefill(gemma_runner, layout, plan_for("reuse", no_drift), held)
    assert _relative(zero.logits, reuse.logits) < 1e-3


def test_the_bf16_kernel_runs_gemmas_own_activation(gemma_runner):
    """bf16 projections (`auto` on AVX512-BF16/AMX CPUs) use the MLP's GELU-tanh, not Llama's SiLU."""
    fast = gemma_runner.with_kernel("bf16").projections
    x = torch.randn(7, gemma_runner.shape.hidden_size)
    for layer in (0, 17):
        want = gemma_runner.projections.mlp(layer, x)
        assert (fast.mlp(layer, x) - want).norm() / want.norm() < 2e-2
