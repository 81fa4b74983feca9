"""Blend-bench workloads: "same documents, another question" and Zipf-popular chunks in retriever order."""

from __future__ import annotations

import statistics
from collections import Counter

from ragkv.bench.quality.families import answer_found
from ragkv.bench.workloads import Request, leading_overlap, retrieve, same_documents, zipf_popularity, zipf_requests


def count_words(text: str) -> int:  # a tokenizer-free stand-in: the shapes need only a count
    return len(text.split()) * 4 // 3


def test_same_documents_two_questions_over_the_same_chunks():
    pairs = same_documents(16, count_words)
    assert pairs == same_documents(16, count_words)  # deterministic per seed
    assert pairs != same_documents(16, count_words, seed=1)
    assert len({first.chunks for first, _ in pairs}) == 16  # a new document set per pair
    asked_chunks = []
    for first, second in pairs:
        assert len(first.chunks) == 8 and first.chunks == second.chunks
        assert first.question != second.question and first.answer != second.answer
        holders = [[i for i, c in enumerate(r.chunks) if answer_found(r.answer, c)] for r in (first, second)]
        assert all(len(h) == 1 for h in holders) and holders[0] != holders[1]  # once each, in different chunks
        asked_chunks.append(holders[0][0])
    assert Counter(asked_chunks) == {i: 2 for i in range(8)}  # the first question's chunk cycles positions


def test_same_documents_splits_differ():
    dev, test = same_documents(4, count_words), same_documents(4, count_words, split="test")
    assert not {c for first, _ in dev for c in first.chunks} & {c for first, _ in test for c in first.chunks}


def test_zipf_requests_shapes_and_determinism():
    requests = zipf_requests(60, count_words)
    assert requests == zipf_requests(60, count_words)
    assert requests != zipf_requests(60, count_words, seed=1)
    text_of: dict[int, str] = {}
    for r in requests:
        assert len(r.chunks) == len(r.chunk_ids) == 8 and len(set(r.chunk_ids)) == 8
        assert all(0 <= i < 40 for i in r.chunk_ids)
        for i, chunk in zip(r.chunk_ids, r.chunks):  # one pool: an id always names the same text
            assert text_of.setdefault(i, chunk) == chunk
        assert sum(answer_found(r.answer, c) for c in r.chunks) == 1


def test_zipf_popular_chunks_lead_and_requests_share_prefixes():
    requests = zipf_requests(200, count_words)
    seen = Counter(i for r in requests for i in r.chunk_ids)
    popular, rare = sum(seen[i] for i in range(5)), sum(seen[i] for i in range(35, 40))
    assert popular > 5 * rare  # Zipf: the head is drawn far more often than the tail
    leaders = Counter(r.chunk_ids[0] for r in requests)
    assert leaders.most_common(1)[0][0] == 0 and leaders[0] > len(requests) / 2
    for r in requests:  # retriever order: mostly by popularity, never sorted by chance alone
        assert statistics.mean(r.chunk_ids[:4]) < statistics.mean(r.chunk_ids[4:])
    zipf = leading_overlap(requests)
    uniform = leading_overlap(zipf_requests(200, count_words, exponent=0.0))
    assert statistics.mean(zipf) >= 2 and statistics.mean(zipf) > 3 * statistics.mean(uniform)
    assert sum(k > 0 for k in zipf) > 0.9 * len(requests)


def test_retrieve_without_noise_orders_by_popularity():
    import random

    popularity = zipf_popularity(40, 1.0)
    assert abs(sum(popularity) - 1) < 1e-9 and popularity == sorted(popularity, reverse=True)
    ids = retrieve(random.Random(0), popularity, 8, noise=0.0)
    assert ids == sorted(ids) and len(set(ids)) == 8


def test_leading_overlap_counts_shared_leading_chunks():
    r = lambda *chunks: Request("q", tuple(chunks), "1")  # noqa: E731
    assert leading_overlap([r("a", "b", "c"), r("a", "b", "d"), r("b", "a"), r("a", "b", "c"), r("c")]) == \
        [0, 2, 0, 3, 0]
