"""Shadow verification (workers/shadow.py): sampled blend requests re-run as full prefills while idle."""

from __future__ import annotations

import time

import pytest

from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.requests import GenerateRequest

PROMPTS = (
    (("The lighthouse keeper of Marrow Point counted ships every evening in a green ledger.",
      "Copper kettles were hammered by hand in the old quarter."), "What did the keeper count?"),
    (("Zorblat is a cold planet with two moons, Tiv and Rel.",
      "Brightwell Robotics makes greenhouse robots; its chief is Lorna Featherstone."), "Who runs Brightwell?"),
    (("The pass key is 71942. Remember it.", "Orchards along the river smell of cider in autumn."),
     "What is the pass key?"),
)


@pytest.fixture
def engine(runner, tmp_path):
    # blended at the default ratio (a server's own setting serves it exactly: nothing to check, the last test)
    eng = Engine(EngineConfig(store=f"disk:{tmp_path / 'b'}", codec="fp16", shadow_sample=1.0,
                              sequence_cache=False, blend=BlendConfig()), runner=runner)
    yield eng
    eng.close()


def _wait_checked(engine, count: int, namespace: str = "") -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        figures = engine.stats().shadow["namespaces"].get(namespace)
        if figures and figures["checked"] >= count:
            return figures
        time.sleep(0.05)
    raise AssertionError("shadow checks did not run")


def test_a_full_sample_measures_the_share_of_identical_answers(engine):
    same = 0
    for chunks, question in PROMPTS:
        ask = dict(question=question, chunks=chunks, max_new_tokens=8)
        blend = engine.generate(GenerateRequest(**ask, mode="blend", recompute_ratio=0.1))
        full = engine.generate(GenerateRequest(**ask, mode="full"))  # not sampled: only blend is checked
        same += blend.token_ids == full.token_ids
    figures = _wait_checked(engine, len(PROMPTS))
    stats = engine.stats().shadow
    assert figures["checked"] == stats["sampled"] == len(PROMPTS) and stats["dropped"] == 0
    assert figures["answer_agreement"] == same / len(PROMPTS)
    assert 0.0 <= figures["first_token_agreement"] <= 1.0 and figures["mean_kl"] >= 0.0


def test_namespaces_are_counted_apart_and_sampling_can_be_off(engine, runner, tmp_path):
    chunks, question = PROMPTS[0]
    engine.generate(GenerateRequest(question=question, chunks=chunks, max_new_tokens=2, namespace="tenant-a"))
    figures = _wait_checked(engine, 1, "tenant-a")
    assert figures["checked"] == 1 and "" not in engine.stats().shadow["namespaces"]
    off = Engine(EngineConfig(store=f"disk:{tmp_path / 'off'}", codec="fp16"), runner=runner)
    try:
        off.generate(GenerateRequest(question=question, chunks=chunks, max_new_tokens=2))
        assert off.stats().shadow == {"sample": 0.0, "sampled": 0, "dropped": 0, "namespaces": {}}
    finally:
        off.close()


def test_a_check_the_full_idle_queue_refuses_is_counted_as_dropped(engine):
    """Scheduler.defer refuses past max_background (tests/workers/test_sequences.py); the verifier counts it."""
    engine.shadow.queued(False)
    engine.shadow.queued(True)
    stats = engine.stats().shadow
    assert (stats["sampled"], stats["dropped"]) == (2, 1)


def test_a_request_served_exactly_is_not_checked(runner, tmp_path):
    """The server's own setting at its default ratio is an exact prefill: a shadow check would compare full
    with full, so none is queued."""
    chunks, question = PROMPTS[0]
    engine = Engine(EngineConfig(store=f"disk:{tmp_path / 'exact'}", codec="fp16", shadow_sample=1.0,
                                 sequence_cache=False), runner=runner)
    try:
        result = engine.generate(GenerateRequest(question=question, chunks=chunks, max_new_tokens=2))
        assert result.stats["blend_method"] == "exact" and engine.stats().shadow["sampled"] == 0
    finally:
        engine.close()
