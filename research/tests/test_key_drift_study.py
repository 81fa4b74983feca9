"""The key-drift oracle study (research/ragkv_research/key_drift_study.py) on one short prompt: exact K/V everywhere
is the full prefill, and exact keys alone repair most of what plain reuse loses."""

from ragkv_research.key_drift_study import Oracle  # noqa: F401  (registers the `oracle` config kind)
from ragkv.bench.quality.configs import parse_config
from ragkv.bench.quality.evaluate import evaluate_prompt
from ragkv.bench.quality.prompts import make_prompts


def test_oracles_bracket_reuse_and_full(runner):
    prompt = make_prompts("dev", lambda text: len(runner.tokenize(text)), ["single_needle"], 1, (500,))[0]
    names = ("full", "reuse", "oracle:b0-30", "oracle:k0-30", "oracle:mean")
    out = evaluate_prompt(runner, prompt, [parse_config(n) for n in names], "fp16")
    assert out["oracle:b0-30"].agree and out["oracle:b0-30"].kl < 1e-2  # every layer exact = full prefill
    assert out["reuse"].kl > 1e-2  # the stored chunks really differ
    assert out["oracle:k0-30"].kl < 0.5 * out["reuse"].kl  # the keys carry most of the damage
    assert out["oracle:mean"].kl != out["reuse"].kl  # the mean shift changes the cache
