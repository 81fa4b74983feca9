"""`ragkv bench blend --quick` runs end to end and writes the CONTRACT's JSON (figures are the bench's job)."""

from ragkv.bench import blend
from workers.requests import MODES


def test_blend_bench_quick_writes_contract_json():
    out = blend.run(quick=True, progress=False)
    for key in ("chunks", "chunk_tokens", "ttft_s", "speedup_vs_full", "accuracy", "agreement_vs_full", "queries"):
        assert key in out
    for key in ("ttft_s", "speedup_vs_full", "accuracy", "agreement_vs_full"):
        assert set(out[key]) == set(MODES)
    assert out["speedup_vs_full"]["full"] == 1.0 and out["agreement_vs_full"]["full"] == 1.0
    assert all(0.0 <= v <= 1.0 for v in out["accuracy"].values())
    assert out["runs"] and out["runs"][0]["chunks"] == out["chunks"]


def test_extract_answer_takes_the_code_or_the_first_line():
    assert blend.extract_answer("The access code for the Elm archive is 34203. Bye") == "34203"
    assert blend.extract_answer("  I do not know.\nmore") == "i do not know"
    assert blend.extract_answer("") == ""
