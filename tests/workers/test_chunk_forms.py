"""Chunk forms: a chunk computed after the lead-in is the real prompt's KV when it opens such a prompt,
the form is part of the block's address and fingerprint, and the engine stores the form it is set to."""

from __future__ import annotations

import pytest
import torch

from workers.cache import KVCache
from workers.chunk_forms import EARLIER_DOCUMENT, CHUNK_FORMS, chunk_fingerprint, compute_chunk, form_lead, lead_in_ids
from workers.engine import Engine, EngineConfig
from workers.prompt import build_prompt
from workers.rope import rerotate_keys

TEXT = "The Harbor observatory opens with the code 24025. Its door is painted amber and faces the sea."


def test_a_lead_chunk_opening_a_default_prompt_is_that_prompt_s_kv(runner):
    ids = runner.tokenize(TEXT)
    layout = build_prompt(runner.tokenizer, "", [ids], "Which code opens it?")
    assert tuple(layout.token_ids[: layout.prefix_len]) == lead_in_ids(runner.tokenizer)
    cache = KVCache.empty(runner.shape.num_layers)
    runner.forward(torch.tensor(layout.token_ids), torch.arange(layout.num_tokens), cache)
    start, end = layout.chunk_spans[0]
    lead, alone = compute_chunk(runner, ids, "lead"), compute_chunk(runner, ids, "alone")
    for layer in (1, runner.shape.num_layers - 1):
        full_k = rerotate_keys(cache.layers[layer].keys[:, start:end], -start, runner.inv_freq)
        full_v = cache.layers[layer].values[:, start:end]
        assert torch.allclose(lead.keys[layer], full_k, atol=1e-3)
        assert torch.allclose(lead.values[layer], full_v, atol=1e-3)
        assert not torch.allclose(alone.values[layer], full_v, atol=1e-2)  # the comparison can fail
    assert lead.token_ids == ids and lead.keys.shape == alone.keys.shape


def test_a_doc_chunk_second_after_the_earlier_document_is_that_prompt_s_kv(runner):
    ids = runner.tokenize(TEXT)
    layout = build_prompt(runner.tokenizer, "", [runner.tokenize(EARLIER_DOCUMENT), ids], "Which code opens it?")
    start, end = layout.chunk_spans[1]
    assert tuple(layout.token_ids[:start]) == form_lead(runner.tokenizer, "doc")
    cache = KVCache.empty(runner.shape.num_layers)
    runner.forward(torch.tensor(layout.token_ids), torch.arange(layout.num_tokens), cache)
    doc, lead = compute_chunk(runner, ids, "doc"), compute_chunk(runner, ids, "lead")
    for layer in (1, runner.shape.num_layers - 1):
        full_k = rerotate_keys(cache.layers[layer].keys[:, start:end], -start, runner.inv_freq)
        full_v = cache.layers[layer].values[:, start:end]
        assert torch.allclose(doc.keys[layer], full_k, atol=1e-3)
        assert torch.allclose(doc.values[layer], full_v, atol=1e-3)
        assert not torch.allclose(lead.values[layer], full_v, atol=1e-2)  # the comparison can fail
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
