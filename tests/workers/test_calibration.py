"""Blend calibration: deterministic, stored next to the model, reused, and used by the engine."""

from dataclasses import dataclass

import pytest

import workers.calibration as calibration
from workers.blend import BlendConfig
from workers.calibration import Score, Target, calibrate, choose, config_key, load_calibration


@dataclass(frozen=True)
class Prompt:
    family: str
    chunks: tuple[str, ...]
    question: str
    answer: str
    system_prompt: str = ""
    max_new_tokens: int = 6

    def correct(self, text: str) -> bool:
        return self.answer in text


PROMPTS = (
    Prompt("codes", ("The code of the red door is 41327.", "Blue doors have no code at all."),
           "What is the code of the red door?", "41327"),
    Prompt("names", ("Mara keeps the lighthouse at Marrow Point.", "Tomas bakes bread in the valley."),
           "Who keeps the lighthouse?", "Mara"),
)
CANDIDATES = (BlendConfig(recompute_ratio=0.2, method="deviation"), BlendConfig(recompute_ratio=1.0, method="deviation"))


def test_choose_takes_the_cheapest_setting_that_meets_the_target():
    fam = {"families": {"a": 1.0}}
    scores = {"full": Score(1.0, 1.0, 1.0, **fam), "reuse": Score(0.5, 0.5, 0.02, families={"a": 0.5}),
              "cheap": Score(0.5, 0.5, 0.05, families={"a": 0.5}), "good": Score(1.0, 0.96, 0.2, **fam),
              "better": Score(1.0, 1.0, 0.24, **fam), "costly": Score(1.0, 1.0, 0.6, **fam)}
    assert choose(scores, Target()) == ("good", True)
    assert choose(scores, Target(min_agreement=0.99)) == ("better", True)
    # nothing meets it within the compute limit: the best trade-off there, flagged
    assert choose(scores, Target(min_agreement=0.99, max_compute=0.21)) == ("good", False)


def test_a_family_below_reuse_fails_the_target():
    scores = {"full": Score(1.0, 1.0, 1.0, families={"a": 1.0, "b": 1.0}),
              "reuse": Score(0.5, 0.0, 0.02, families={"a": 1.0, "b": 0.0}),
              "x": Score(1.0, 1.0, 0.1, families={"a": 0.9, "b": 1.0})}
    assert not calibration.meets(scores["x"], scores["full"], scores["reuse"], Target(max_accuracy_drop=0.5))


def test_calibration_is_deterministic_and_its_stored_result_is_reused(runner, tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    first = calibrate(runner, PROMPTS, "fp16", CANDIDATES, path=path)
    assert not first["reused"] and path.exists()
    again = calibrate(runner, PROMPTS, "fp16", CANDIDATES, path=path, force=True)
    assert {k: v for k, v in again.items() if k != "reused"} == {k: v for k, v in first.items() if k != "reused"}
    assert first["scores"]["deviation@1"]["agreement"] == 1.0  # ratio 1 = full prefill

    def no_measuring(*args, **kwargs):
        raise AssertionError("a stored calibration must be reused, not measured again")

    monkeypatch.setattr(calibration, "evaluate", no_measuring)
    stored = calibrate(runner, PROMPTS, "fp16", CANDIDATES, path=path)
    assert stored["reused"] and stored["chosen"] == first["chosen"]
    with pytest.raises(AssertionError):  # other inputs (codec) are measured again
        calibrate(runner, PROMPTS, "int8", CANDIDATES, path=path)
    assert load_calibration(runner, "fp16", path)["chosen_key"] == first["chosen_key"]


def test_fast_greedy_path_gives_the_tokens_of_plain_decoding(runner):
    from kvstore.store import BlockStore
    from workers.generate import SamplingParams, decode
    from workers.modes import plan_for
    from workers.pipeline import HeldChunks, run_prefill

    store = BlockStore(None, "int4", runner.fingerprint)
    prompt = Prompt("codes", PROMPTS[0].chunks + PROMPTS[1].chunks, PROMPTS[0].question, "41327", max_new_tokens=8)
    prepared = calibration._Prepared(runner, prompt, store, store)
    for config, reuse in ((BlendConfig(), True), (BlendConfig(recompute_ratio=0.3, method="deviation"), False),
                          (BlendConfig(recompute_ratio=1.0), False)):
        tokens = prepared.run(runner, config, reuse=reuse).tokens
        out = run_prefill(runner, prepared.layout, plan_for("reuse" if reuse else "blend", config),
                          HeldChunks(prepared.prefix, prepared.kvs))
        plain = list(decode(runner, out.cache, out.logits, prepared.layout.num_tokens, SamplingParams(max_new_tokens=8)))
        assert tokens == plain


def test_engine_uses_the_calibrated_setting_when_no_ratio_is_given(runner, tmp_path, monkeypatch):
    from workers.engine import Engine, EngineConfig
    from workers.requests import GenerateRequest

    path = tmp_path / "calibration.json"
    record = calibrate(runner, PROMPTS[:1], "fp16", (BlendConfig(recompute_ratio=0.3, method="deviation"),), path=path)
    monkeypatch.setattr(calibration, "calibration_path", lambda runner, codec, namespace="": path)
    engine = Engine(EngineConfig(store=f"disk:{tmp_path / 'blocks'}", codec="fp16"), runner=runner)
    ask = dict(question=PROMPTS[0].question, chunks=PROMPTS[0].chunks, max_new_tokens=2)
    stats = engine.generate(GenerateRequest(**ask)).stats
    assert (stats["blend_setting"], stats["blend_config"]) == ("calibrated", record["chosen_key"])
    assert stats["blend_method"] == "deviation" and stats["recompute_ratio"] == 0.3
    stats = engine.generate(GenerateRequest(**ask, recompute_ratio=0.5)).stats
    assert (stats["blend_setting"], stats["blend_config"]) == ("request", "deviation@0.5")
    plain = Engine(EngineConfig(store=f"disk:{tmp_path / 'blocks'}", codec="fp16", use_calibration=False), runner=runner)
    stats = plain.generate(GenerateRequest(**ask)).stats
    assert (stats["blend_setting"], stats["blend_config"]) == ("default", BlendConfig().name)
    engine.close()
    plain.close()


def test_candidates_are_the_product_methods_at_every_ratio():
    """`ragkv calibrate` sweeps the product's selection methods (research/ registers more) x ratios."""
    from ragkv.commands.calibrate import candidates

    plain = candidates(None, None)
    assert {c.method for c in plain} == {"deviation", "gradual"} and len(plain) == 12
    assert [c.name for c in candidates("gradual", "0.1,0.5")] == ["gradual@0.1", "gradual@0.5"]
    assert config_key(BlendConfig(recompute_ratio=0.3, method="deviation")) == "deviation@0.3"
    assert config_key(BlendConfig(recompute_ratio=0.3, check_layer=1)) == "gradual@0.3[check_layer=1]"
