"""`ragkv bench blend --workload same-docs|zipf` (ragkv/bench/reuse.py), small: the JSON and that the exact
sequence tree serves "same documents, another question" through the SDK. Short answers and blend at 0.15
(not the default ratio): these check the mechanics (the JSON, what the tree serves), not the default's quality."""

from __future__ import annotations

from ragkv.bench import reuse


def test_same_documents_another_question_is_served_from_the_tree():
    out = reuse.run("same-docs", count=1, chunk_tokens=64, progress=False, max_new_tokens=4, recompute_ratio=0.15)
    assert out["workload"] == "same-docs" and out["queries"] == 1 and set(out["ttft_s"]) == set(reuse.MODES)
    # the first question's idle-time exact prefill stored the 8 chunks: the second reads all of them
    assert out["sequence_chunks_mean"] == {"full": 0, "blend": 0, "tree+blend": 8}
    assert 0 <= out["agreement_vs_full"]["tree+blend"] <= 1 and out["speedup_vs_full"]["full"] == 1.0


def test_zipf_requests_share_leading_chunks():
    out = reuse.run("zipf", count=2, chunk_tokens=64, progress=False, max_new_tokens=4, recompute_ratio=0.15)
    assert out["workload"] == "zipf" and out["queries"] == 2 and out["leading_overlap_mean"] >= 0
    assert out["sequence_chunks_mean"]["blend"] == 0 and set(out["agreement_vs_full"]) == set(reuse.MODES)
