"""CacheBlend math on the real default model: re-rotation, ratio 1 = full, ratio 0 = reuse."""

import pytest
import torch

from workers.blend import COMPRESSED_METHOD, BlendConfig, fuse_chunks
from workers.modes import plan_for
from workers.pipeline import HeldChunks, run_prefill
from workers.rope import rerotate_keys
from workers.selection import kv_deviation, select_tokens
from workers.selfcheck import check_full_ratio, check_rerotation, check_zero_ratio


@pytest.mark.parametrize("delta", [1, 37, 1000])
def test_rerotated_keys_equal_keys_at_target_positions(runner, delta):
    result = check_rerotation(runner, delta=delta)
    assert result.passed, result


def test_rerotation_composes_and_inverts():
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64))
    keys = torch.randn(2, 3, 5, 64)
    there = rerotate_keys(keys, 11, inv_freq)
    assert torch.allclose(rerotate_keys(rerotate_keys(keys, 5, inv_freq), 6, inv_freq), there, atol=1e-5)
    assert torch.allclose(rerotate_keys(there, -11, inv_freq), keys, atol=1e-5)
    per_token = rerotate_keys(keys, torch.tensor([11] * 5), inv_freq)
    assert torch.allclose(per_token, there, atol=1e-6)


def test_ratio_one_reproduces_full_prefill_logits(runner):
    result = check_full_ratio(runner)
    assert result.passed, result


def test_ratio_zero_equals_reuse(runner):
    result = check_zero_ratio(runner)
    assert result.passed, result


def test_a_setting_at_or_above_exact_from_is_an_exact_plan():
    """The server's setting from `exact_from` on runs as an exact prefill (the stored prefix and exact head, the
    rest prefilled) under blend's name; a ratio asked for by a request or by name, or a setting without
    `exact_from` (every caller but a server's), is blended as asked."""
    from workers.blend import EXACT_FROM, server_setting

    default = server_setting()
    assert default.exact and default.recompute_ratio >= default.exact_from == EXACT_FROM
    plan = plan_for("blend", default)
    assert (plan.mode, plan.stored_prefix, plan.stored_chunks, plan.blend, plan.exact_for) == ("blend", True, False,
                                                                                               None, default)
    assert plan_for("blend", BlendConfig(recompute_ratio=EXACT_FROM, exact_from=EXACT_FROM)).exact_for is not None
    for blended in (BlendConfig(recompute_ratio=EXACT_FROM / 2, exact_from=EXACT_FROM), default.with_ratio(0.9),
                    default.named("deviation"), BlendConfig(), BlendConfig(recompute_ratio=1.0)):
        assert not blended.exact and plan_for("blend", blended).blend == blended
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="exact_from"):
            BlendConfig(exact_from=bad)


def test_selection_picks_largest_deviation():
    deviation = torch.tensor([0.0, 5.0, 1.0, 9.0, 2.0, 0.5])
    candidates = torch.tensor([1, 2, 3, 4, 5])
    assert select_tokens(deviation, candidates, 2).tolist() == [1, 3]
    assert select_tokens(deviation, candidates, 0).numel() == 0
    assert select_tokens(deviation, candidates, 99).tolist() == [1, 2, 3, 4, 5]


def test_kv_deviation_measures():
    old = torch.ones(2, 4, 8)
    fresh = old.clone()
    fresh[:, 2] *= 3
    for measure in ("k", "v", "kv"):
        dev = kv_deviation(fresh, fresh, old, old, measure)
        assert dev.argmax() == 2 and dev[0] == 0
    with pytest.raises(ValueError):
        kv_deviation(fresh, fresh, old, old, "q")


def test_blend_recomputes_the_requested_fraction(runner):
    from workers.prompt import build_prompt

    chunks = [runner.tokenize("Alpha beta gamma delta. " * 6), runner.tokenize("Epsilon zeta eta theta. " * 6)]
    layout = build_prompt(runner.tokenizer, "", chunks, "Which letters?")
    held = HeldChunks(runner.chunk_kv(layout.prefix_ids), [runner.chunk_kv(c) for c in chunks])
    _, computed = fuse_chunks(runner, layout, held.prefix_kv, held.chunk_kvs)
    chunk_tokens = sum(e - s for s, e in layout.chunk_spans)
    stats = run_prefill(runner, layout, plan_for("blend", BlendConfig(recompute_ratio=0.25)), held).stats
    assert stats.recomputed_tokens == round(0.25 * chunk_tokens)
    assert stats.always_computed_tokens == int(computed[layout.prefix_len:].sum())
    assert 0 < stats.compute_fraction < 1 and set(stats.breakdown) >= {"load", "fuse", "shift", "layers", "logits"}


def test_fused_cache_holds_the_stored_kv_and_zeros_where_nothing_is_stored(runner):
    from workers.prompt import build_prompt

    chunks = [runner.tokenize("Alpha beta gamma delta. " * 6), runner.tokenize("Epsilon zeta eta theta. " * 6)]
    layout = build_prompt(runner.tokenizer, "", chunks, "Which letters?")
    stored = [runner.chunk_kv(c) for c in chunks]
    cache, computed = fuse_chunks(runner, layout, runner.chunk_kv(layout.prefix_ids), stored)
    (start, end), layer = layout.chunk_spans[1], cache.layers[3]
    assert torch.allclose(layer.keys[:, start:end], rerotate_keys(stored[1].keys[3], start, runner.inv_freq), atol=1e-6)
    assert torch.equal(layer.values[:, start:end], stored[1].values[3])
    assert computed[layout.prefix_len:].any()  # separators and the question: computed by blend, zero until then
    assert all(not kv.keys[:, computed].any() and not kv.values[:, computed].any() for kv in cache.layers)


def test_the_default_setting_runs_one_method_per_chunk_kind(runner):
    """Whole chunks run `method`, a prompt holding a chunk compressed at ingest runs COMPRESSED_METHOD in
    place of the default one; a method asked for by name runs over both."""
    from workers.eviction.chunks import compress_chunk
    from workers.prompt import build_prompt
    from workers.requests import CompressionSpec

    default = BlendConfig()
    assert default.for_prompt(compressed=False) == default
    assert default.for_prompt(compressed=True).method == COMPRESSED_METHOD
    assert (default.check_layer, default.for_prompt(compressed=True).check_layer) == (2, 1)  # each as chosen
    assert default.for_prompt(compressed=True).recompute_ratio == default.compressed_ratio == 0.0  # the drift only
    asked = default.with_ratio(0.3)  # a request's own ratio: over both kinds, each with its method
    assert asked.for_prompt(compressed=True).recompute_ratio == asked.for_prompt(compressed=False).recompute_ratio == 0.3
    assert asked.for_prompt(compressed=True).method == COMPRESSED_METHOD
    with pytest.raises(ValueError, match="compressed_ratio"):
        BlendConfig(compressed_ratio=1.5)
    named = default.named("deviation")
    assert named.for_prompt(compressed=False) == named
    # over compressed chunks the method is the same, and the context drift stays on
    assert named.for_prompt(compressed=True) == named
    assert default.context_drift and default.for_prompt(compressed=True).context_drift

    chunks = [runner.tokenize("Alpha beta gamma delta. " * 6), runner.tokenize("Epsilon zeta eta theta. " * 6)]
    layout = build_prompt(runner.tokenizer, "", chunks, "Which letters?")
    prefix = runner.chunk_kv(layout.prefix_ids)
    whole = [runner.chunk_kv(c) for c in chunks]
    small = [compress_chunk(runner, kv, CompressionSpec(policy="kvzip", budget=0.5))[0] for kv in whole]
    ran = {}
    for kind, stored in (("whole", whole), ("compressed", small)):
        for config in (default, named):
            stats = run_prefill(runner, layout, plan_for("blend", config), HeldChunks(prefix, stored)).stats
            ran[kind, config.method] = (stats.blend_method, stats.blend_config)
            assert stats.check_layer == config.for_prompt(kind == "compressed").check_layer
    assert ran["whole", default.method] == (default.method, default.name)
    assert ran["compressed", default.method] == (COMPRESSED_METHOD, default.for_prompt(True).name)
    assert ran["whole", "deviation"] == ran["compressed", "deviation"] == ("deviation", named.name)
