"""Exact reuse of leading chunk runs (workers/sequences.py) through the engine, on the real model and store."""

from __future__ import annotations

import time

import pytest

from workers.blend import BlendConfig
from workers.engine import Engine, EngineConfig
from workers.modes import plan_for
from workers.pipeline import run_prefill
from workers.prompt import build_prompt
from workers.requests import GenerateRequest

CHUNKS = ("The lighthouse keeper of Marrow Point counted ships every evening in a green ledger.",
          "Copper kettles were hammered by hand in the old quarter, each stamped with the smith's mark.",
          "A slow river bends around the hill; in autumn its orchards smell of cider.")


@pytest.fixture
def engine(runner, tmp_path):
    # CacheBlend at the default ratio, which a server's own setting serves exactly (the last test)
    eng = Engine(EngineConfig(store=f"disk:{tmp_path / 'blocks'}", codec="fp16", prefill_kernel="fp32",
                              blend=BlendConfig()), runner=runner)
    yield eng
    eng.close()


def _prefill(engine, chunks, question, mode="blend", system_prompt="", namespace=""):
    runner = engine.runner
    layout = build_prompt(runner.tokenizer, system_prompt, [runner.tokenize(c) for c in chunks], question)
    source = engine.chunks.for_request(namespace, [None] * len(chunks), lambda: False)
    return layout, run_prefill(runner, layout, plan_for(mode, BlendConfig()), source)


def _relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


def test_a_stored_sequence_serves_its_leading_chunks_exactly(engine):
    """After a full prefill of the same chunks, blend reads them all from the tree: its logits are full's
    (within the fp16 the nodes are kept in), where plain blend over the same chunks is not."""
    engine.ingest(CHUNKS)
    layout, before = _prefill(engine, CHUNKS, "What did the keeper count?")
    assert before.stats.sequence_chunks == 0
    engine.generate(GenerateRequest(question="Who made kettles?", chunks=CHUNKS, mode="full", max_new_tokens=1))
    _, full = _prefill(engine, CHUNKS, "What did the keeper count?", mode="full")
    _, after = _prefill(engine, CHUNKS, "What did the keeper count?")
    assert after.stats.sequence_chunks == after.stats.chunks_hit == len(CHUNKS)
    assert after.stats.recomputed_tokens == 0  # nothing stored is approximate: nothing to recompute
    assert _relative(after.logits, full.logits) < 2e-2
    assert _relative(after.logits, full.logits) < _relative(before.logits, full.logits)
    assert 0 < after.stats.compute_fraction < 0.2


def test_a_changed_piece_anywhere_before_is_a_miss(engine):
    engine.generate(GenerateRequest(question="Q?", chunks=CHUNKS, mode="full", max_new_tokens=1))
    assert _prefill(engine, CHUNKS, "Other question?")[1].stats.sequence_chunks == 3
    changed_last = CHUNKS[:2] + ("A fast river.",)
    assert _prefill(engine, changed_last, "Q?")[1].stats.sequence_chunks == 2
    changed_first = ("A different first chunk.",) + CHUNKS[1:]
    assert _prefill(engine, changed_first, "Q?")[1].stats.sequence_chunks == 0
    reordered = (CHUNKS[1], CHUNKS[0], CHUNKS[2])
    assert _prefill(engine, reordered, "Q?")[1].stats.sequence_chunks == 0
    assert _prefill(engine, CHUNKS, "Q?", system_prompt="Be brief.")[1].stats.sequence_chunks == 0
    assert _prefill(engine, CHUNKS, "Q?", namespace="tenant-b")[1].stats.sequence_chunks == 0
    _, prefix = _prefill(engine, CHUNKS, "Q?", mode="prefix")  # exact-prefix mode reads the tree too
    assert prefix.stats.sequence_chunks == 3 and prefix.stats.recomputed_tokens < 20


def test_a_blended_prompt_is_made_exact_while_idle(engine):
    """The first blend queues an idle-time exact prefill of its chunks; the next question over them hits."""
    ask = dict(chunks=CHUNKS, max_new_tokens=2)
    first = engine.generate(GenerateRequest(question="What did the keeper count?", **ask))
    assert first.stats["sequence_chunks"] == 0
    deadline = time.monotonic() + 120
    # the job counts its fill, then the scheduler counts it done at its next step: wait for both
    while (engine.stats().sequences.fills < 1 or engine.stats().batch.background_done < 1) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = engine.stats()
    assert stats.sequences.fills == 1 and stats.sequences.nodes_stored == 3 and stats.batch.background_done >= 1
    second = engine.generate(GenerateRequest(question="Who made the kettles?", **ask))
    assert second.stats["sequence_chunks"] == 3 and second.stats["recomputed_tokens"] == 0
    assert engine.stats().as_dict()["sequences"]["hits"] >= 1


def test_background_queue_is_bounded(engine):
    from workers.batching.scheduler import Scheduler

    scheduler: Scheduler = engine.scheduler
    assert scheduler.config.max_background >= 1

    def idle_job():
        yield

    blocked = scheduler.call(lambda: [scheduler.defer(idle_job()) for _ in range(scheduler.config.max_background + 5)])
    assert blocked.count(False) >= 5 and len(scheduler.background) <= scheduler.config.max_background


@pytest.fixture
def default_engine(runner, tmp_path):
    eng = Engine(EngineConfig(store=f"disk:{tmp_path / 'default'}", codec="fp16", prefill_kernel="fp32"), runner=runner)
    yield eng
    eng.close()


def test_the_default_setting_is_served_exactly_and_stores_its_sequence(default_engine):
    """At the server's default ratio blending saves too little: the request is an exact prefill, token for
    token `prefix` mode's, and it stores its chunk sequence at once (no idle-time fill), so another question
    over the same documents reads them exactly. A request's own ratio is blended as asked."""
    engine = default_engine
    setting = engine.blend_setting[0]
    assert setting.exact
    engine.ingest(CHUNKS)
    ask = dict(chunks=list(CHUNKS), max_new_tokens=8)
    exact = engine.generate(GenerateRequest(question="What did the keeper count?", mode="blend", namespace="a", **ask))
    stats = exact.stats
    assert (stats["mode"], stats["blend_method"], stats["blend_config"]) == ("blend", "exact", setting.name)
    assert stats["chunks_hit"] == stats["sequence_chunks"] == 0  # no stored chunk KV read
    assert stats["compute_fraction"] > 0.5  # every token after the stored prefix was prefilled
    prefix = engine.generate(GenerateRequest(question="What did the keeper count?", mode="prefix", namespace="b",
                                             **ask))
    assert exact.token_ids == prefix.token_ids
    again = engine.generate(GenerateRequest(question="Who made kettles?", mode="blend", namespace="a", **ask))
    assert again.stats["sequence_chunks"] == len(CHUNKS) and again.stats["prefix_hit"]
    assert engine.sequences.counters.fills == 0
    asked = engine.generate(GenerateRequest(question="Who made kettles?", mode="blend",  # where they were ingested
                                            recompute_ratio=setting.recompute_ratio, **ask))
    assert asked.stats["blend_method"] == setting.method and asked.stats["chunks_hit"] == len(CHUNKS)
