"""Chunk forms: a chunk computed after the lead-in is the real prompt's KV when it opens such a prompt,
the form is part of the block's address and fingerprint, and the engine stores the form it is set to."""

from __future__ import annotations

import pytest
import torch

from workers.cache import KVCache
from workers.chunk_forms import CHUNK_FORMS, EARLIER_DOCUMENT, chunk_fingerprint, compute_chunk, form_lead, lead_in_ids
from workers.engine import Engine, EngineConfig
from workers.prompt import build_prompt
from workers.rope import rerotate_keys

TEXT = "The Harbor observatory opens with the code 24025. Its door is painted amber and faces the sea."


def assert_prompt_kv(runner, layout, index: int, form: str, other: str) -> None:
    """Chunk `index` of the prompt computed in `form` is the full prefill's KV there (keys moved back to
    0..n-1); computed in the `other` form it is not (so the comparison can fail)."""
    cache = KVCache.empty(runner.shape.num_layers)
    runner.forward(torch.tensor(layout.token_ids), torch.arange(layout.num_tokens), cache)
    start, end = layout.chunk_spans[index]
    ids = layout.token_ids[start:end]
    mine, theirs = compute_chunk(runner, ids, form), compute_chunk(runner, ids, other)
    for layer in (1, runner.shape.num_layers - 1):
        full_k = rerotate_keys(cache.layers[layer].keys[:, start:end], -start, runner.inv_freq)
        full_v = cache.layers[layer].values[:, start:end]
        assert torch.allclose(mine.keys[layer], full_k, atol=1e-3)
        assert torch.allclose(mine.values[layer], full_v, atol=1e-3)
        assert not torch.allclose(theirs.values[layer], full_v, atol=1e-2)
    assert mine.token_ids == ids and mine.keys.shape == theirs.keys.shape


def test_a_lead_chunk_opening_a_default_prompt_is_that_prompt_s_kv(runner):
    layout = build_prompt(runner.tokenizer, "", [runner.tokenize(TEXT)], "Which code opens it?")
    assert tuple(layout.token_ids[: layout.prefix_len]) == lead_in_ids(runner.tokenizer)
    assert_prompt_kv(runner, layout, 0, "lead", "alone")


def test_a_doc_chunk_second_after_the_earlier_document_is_that_prompt_s_kv(runner):
    chunks = [runner.tokenize(EARLIER_DOCUMENT), runner.tokenize(TEXT)]
    layout = build_prompt(runner.tokenizer, "", chunks, "Which code opens it?")
    assert tuple(layout.token_ids[: layout.chunk_spans[1][0]]) == form_lead(runner.tokenizer, "doc")
    assert_prompt_kv(runner, layout, 1, "doc", "lead")
    assert form_lead(runner.tokenizer, "alone") == ()


def test_the_form_is_part_of_the_fingerprint(runner):
    prints = {form: chunk_fingerprint(runner.fingerprint, runner.tokenizer, form) for form in CHUNK_FORMS}
    assert prints["alone"] == runner.fingerprint
    assert len(set(prints.values())) == len(CHUNK_FORMS)
    with pytest.raises(ValueError, match="chunk form"):
        chunk_fingerprint(runner.fingerprint, runner.tokenizer, "no-such-form")


def test_the_engine_stores_its_form_and_never_reads_another(runner, tmp_path):
    store = f"disk:{tmp_path / 'blocks'}"
    lead = Engine(EngineConfig(store=store, codec="fp16", chunk_form="lead"), runner=runner)
    alone = Engine(EngineConfig(store=store, codec="fp16", chunk_form="alone"), runner=runner)
    try:
        ids = runner.tokenize(TEXT)
        [ref] = lead.ingest([TEXT])
        stored = lead.store.get(ref.id, ids)
        want = compute_chunk(lead.runner, ids, "lead").values.float()  # the engine computes with its prefill kernel
        assert torch.allclose(stored.values.float(), want, atol=1e-2)
        [other] = alone.ingest([TEXT])
        assert other.id != ref.id and not other.cached  # same text, other form: another block
        assert alone.store.get(ref.id, ids) is None  # a lead block is foreign to the alone engine
        assert lead.stats().as_dict()["chunk_form"] == "lead"
    finally:
        lead.close()
        alone.close()
