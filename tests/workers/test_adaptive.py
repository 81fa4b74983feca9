"""The adaptive ratio (workers/adaptive.py): shadow checks steer the ratio of requests without one."""

from __future__ import annotations

import logging

import pytest

from workers.adaptive import RatioController, parse_ratios
from workers.engine import Engine, EngineConfig
from workers.requests import GenerateRequest

PROMPTS = (
    (("Fenwick Mill grinds barley on Tuesdays and rye on Fridays.", "The ferry to Lusk leaves at dawn."),
     "What does Fenwick Mill grind on Fridays?"),
    (("Captain Ilse Varga sailed the Petrel to the Sable Isles in 1911.", "Tin roofs rattle in the rain."),
     "Which ship did Captain Varga sail?"),
    (("The vault code is 58213.", "Wild thyme grows between the stones of the old wall."),
     "What is the vault code?"),
)


def test_the_ladder_moves_up_below_the_target_and_down_with_margin(caplog):
    c = RatioController(target=0.75, ratios=(0.15, 0.3, 0.5), window=2)
    server = 0.2  # the ratio a request runs at without the controller
    assert c.ratio("a", server) == 0.15 and c.ratio("b", server) == 0.15  # the rung nearest it
    assert c.ratio("own", 0.45) == 0.5 and c.ratio("own", server) == 0.5  # or nearest its own calibration, once
    assert c.observe("unseen", 0.15, False) is None and "unseen" not in c.as_dict()["namespaces"]
    with caplog.at_level(logging.INFO, logger="ragkv.adaptive"):
        assert c.observe("a", 0.15, True) is None  # the window is not full yet
        up = c.observe("a", 0.15, False)  # 1 of 2 < 0.75
    assert (up.old, up.new, up.agreement, up.checks) == (0.15, 0.3, 0.5, 2)
    assert "0.15 -> 0.3" in caplog.text and c.ratio("b", server) == 0.15  # namespaces apart
    assert c.observe("a", 0.15, False) is None and c.as_dict()["namespaces"]["a"]["checks"] == 0  # stale: ignored
    c.observe("a", 0.3, False), c.observe("a", 0.3, False)
    for _ in range(4):  # at the top it stays
        c.observe("a", 0.5, False)
    assert c.ratio("a", server) == 0.5
    c.observe("a", 0.5, True), c.observe("a", 0.5, False)  # 0.5: between target and margin: stays
    assert c.ratio("a", server) == 0.5
    c.observe("a", 0.5, True), c.observe("a", 0.5, True)  # 1.0 >= (1 + 0.75) / 2: one rung down
    assert c.ratio("a", server) == 0.3
    state = c.as_dict()
    assert state["changed"] == 3 and [(x["old"], x["new"]) for x in state["changes"]] == [
        (0.15, 0.3), (0.3, 0.5), (0.5, 0.3)]


@pytest.mark.parametrize("text", ["", "0.3,0.15", "0.2,0.2", "0.1,1.5", "a,b"])
def test_bad_ladders_are_refused_naming_the_setting(text):
    with pytest.raises(ValueError, match="adaptive_ratios"):
        parse_ratios(text)


def test_serve_config_refuses_an_adaptive_target_without_shadow_checks(tmp_path):
    from ragkv.config import ServeConfig

    path = tmp_path / "ragkv.toml"
    path.write_text("adaptive_target = 0.9\n")
    with pytest.raises(ValueError, match="adaptive_target.*shadow_sample"):
        ServeConfig.load(str(path), env={})
    path.write_text("adaptive_target = 0.9\nshadow_sample = 0.1\nadaptive_window = 0\n")
    with pytest.raises(ValueError, match="adaptive_window"):
        ServeConfig.load(str(path), env={})
    path.write_text('adaptive_target = 0.9\nshadow_sample = 0.1\nadaptive_ratios = "0.2,0.5"\n')
    config = ServeConfig.load(str(path), env={})
    assert (config.engine.adaptive_target, config.engine.adaptive_ratios) == (0.9, "0.2,0.5")


def _idle(engine) -> None:
    engine.scheduler.wait_idle(120)
    assert not engine.scheduler.background, "the shadow check did not run"


def test_the_engine_moves_each_namespace_by_what_its_checks_found(runner, tmp_path):
    """Target 1 and a window of one check: an answer equal to full's moves the next request one rung down,
    another one rung up (within the ladder). Whether each answer equals full's is measured here directly."""
    engine = Engine(EngineConfig(store=f"disk:{tmp_path / 'b'}", codec="fp16", shadow_sample=1.0, sequence_cache=False,
                                 adaptive_target=1.0, adaptive_ratios="0.05,0.15,0.5", adaptive_window=1),
                    runner=runner)
    ladder = (0.05, 0.15, 0.5)
    try:
        expected = ladder.index(min(ladder, key=lambda r: abs(r - engine.blend_setting[0].recompute_ratio)))
        for chunks, question in PROMPTS:
            ask = dict(question=question, chunks=chunks, max_new_tokens=6)
            blend = engine.generate(GenerateRequest(**ask))  # no ratio: the adaptive one
            assert blend.stats["blend_setting"] == "adaptive"
            assert blend.stats["recompute_ratio"] == ladder[expected]
            _idle(engine)
            full = engine.generate(GenerateRequest(**ask, mode="full"))
            agreed = blend.token_ids == full.token_ids
            expected = max(expected - 1, 0) if agreed else min(expected + 1, len(ladder) - 1)
            assert engine.adaptive.as_dict()["namespaces"][""]["ratio"] == ladder[expected]
        own = engine.generate(GenerateRequest(**ask, recompute_ratio=0.3))  # its own ratio: not steered, not counted
        _idle(engine)
        assert own.stats["blend_setting"] == "request"
        stats = engine.stats().as_dict()
        assert stats["adaptive"]["namespaces"][""]["ratio"] == ladder[expected]
        assert stats["shadow"]["namespaces"][""]["checked"] == len(PROMPTS) + 1
        # window 1, target 1: every check moves the ratio unless it is at an end of the ladder
        assert 1 <= stats["adaptive"]["changed"] == len(stats["adaptive"]["changes"])
    finally:
        engine.close()
