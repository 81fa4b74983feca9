"""`ragkv bench blend --quick` runs end to end and writes the documented JSON (docs/benchmarks.md) (figures are the bench's job)."""

from ragkv.bench import blend
from workers.engine import EngineConfig
from workers.projections import resolve_prefill_kernel
from workers.requests import mode_names


def test_blend_bench_quick_writes_contract_json():
    out = blend.run(quick=True, progress=False, chunk_tokens=48)  # --quick's 4 chunks, half its 96 tokens: same JSON
    for key in ("chunks", "chunk_tokens", "ttft_s", "speedup_vs_full", "accuracy", "agreement_vs_full", "queries"):
        assert key in out
    for key in ("ttft_s", "speedup_vs_full", "accuracy", "agreement_vs_full"):
        assert set(out[key]) == set(mode_names())
    assert out["speedup_vs_full"]["full"] == 1.0 and out["agreement_vs_full"]["full"] == 1.0
    assert set(out["speedup_paired"]) == set(mode_names()) and out["speedup_paired"]["full"] == 1.0
    assert all(0.0 <= v <= 1.0 for v in out["accuracy"].values())
    assert out["runs"] and out["runs"][0]["chunks"] == out["chunks"]
    assert 0.0 <= out["codec_only"]["accuracy"] <= 1.0
    # the engine's defaults, not the bench's own
    assert (out["codec"], out["prefill_kernel"]) == (EngineConfig.codec, resolve_prefill_kernel(EngineConfig.prefill_kernel))


def test_extract_answer_takes_the_code_or_the_first_line():
    assert blend.extract_answer("The access code for the Elm archive is 34203. Bye") == "34203"
    assert blend.extract_answer("  I do not know.\nmore") == "i do not know"
    assert blend.extract_answer("") == ""


def test_codec_only_is_full_prefill_up_to_the_codec(runner):
    """With an (almost) lossless codec codec_only is the full prefill; with 2-bit KV it moves away."""
    from functools import partial

    import torch

    from kvstore.codecs import make_codec
    from workers.cache import KVCache
    from workers.prompt import build_prompt

    chunks = [runner.tokenize(t) for t in ("The Heron archive keeps 41 ledgers.", "Its door is painted teal.")]
    layout = build_prompt(runner.tokenizer, "", chunks, "What colour is the door?")
    ids = torch.tensor(layout.token_ids)
    full = runner.forward(ids, torch.arange(len(ids)), KVCache.empty(runner.shape.num_layers))
    fp16, _ = blend.codec_only_prefill(runner, layout, partial(blend.stored_through, make_codec("fp16")))
    kivi2, _ = blend.codec_only_prefill(runner, layout, partial(blend.stored_through, make_codec("kivi2")))
    fp16_gap, kivi2_gap = (full - fp16).abs().max(), (full - kivi2).abs().max()
    assert fp16_gap < 0.05 * full.abs().max()
    assert kivi2_gap > 5 * fp16_gap
