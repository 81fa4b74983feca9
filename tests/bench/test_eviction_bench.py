"""`ragkv bench eviction` building blocks, on the real model with short prompts (figures are the bench's job)."""

import random

import pytest

from tqdm import tqdm

from ragkv.bench import eviction


def test_retention_prompt_puts_the_persona_in_the_protected_prefix(runner):
    layout = eviction.retention_prompt(runner, random.Random(0), num_chunks=2, chunk_tokens=40)
    prefix = runner.detokenize(layout.prefix_ids)
    assert "lighthouse" in prefix and "Ahoy" in prefix
    assert len(layout.chunk_spans) == 2
    question = runner.detokenize(layout.token_ids[layout.suffix_start:])
    assert any(q in question for q in eviction.PERSONA_QUESTIONS)


def test_retention_rows_measure_distance_from_the_full_cache(runner):
    layout = eviction.retention_prompt(runner, random.Random(1), num_chunks=2, chunk_tokens=40)
    keep_all, keep_sinks = ("streaming", 1.0, True), ("streaming", 8, False)
    with tqdm(disable=True) as bar:
        rows = eviction.retention_rows(runner, layout, [keep_all, keep_sinks], bar)
    assert rows["full"]["answer"]
    assert rows[keep_all]["agreement"] == 1.0 and abs(rows[keep_all]["kl"]) < 1e-4
    assert rows[keep_sinks]["kl"] > 10 * max(rows[keep_all]["kl"], 1e-4)  # 8 tokens left of ~150: it shows
    assert rows[keep_sinks]["kv_bytes_ratio"] < 0.1


def test_protection_effect_is_the_mean_over_policies_per_budget():
    def row(policy, budget, protect, agreement, kl):
        return {"policy": policy, "budget": budget, "protect": protect, "agreement_vs_full": agreement, "kl_vs_full": kl}

    results = [row("a", 0.1, True, 0.8, 0.2), row("b", 0.1, True, 0.6, 0.4),
               row("a", 0.1, False, 0.5, 1.0), row("b", 0.1, False, 0.7, 0.0)]
    assert eviction.protection_effect(results) == {"0.1": pytest.approx(
        {"agreement_with": 0.7, "agreement_without": 0.6, "kl_with": 0.3, "kl_without": 0.5})}
