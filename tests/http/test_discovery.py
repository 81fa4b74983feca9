"""Discovery: ingested chunks pasted into a message are served from the store, found by the text index."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI
from openai_helpers import DOCS, QUESTION, ragkv_of

from kvstore.backends.memory import MemoryBackend
from kvstore.text_index import IndexedChunk, TextIndex, index_url, paragraph_count
from workers.discovery import Found, discover

TWO_PARAGRAPHS = "Osric Vale sold salt.\n\nHe also founded a guild in Lindorf."


def _index(*texts: str) -> TextIndex:
    index = TextIndex(MemoryBackend(), "fp")
    index.record(texts, [IndexedChunk(f"{i:064x}", 5, paragraph_count(t)) for i, t in enumerate(texts)])
    return index


def test_discover_splits_at_blank_lines_and_prefers_the_longest_chunk():
    index = _index("A chunk.", TWO_PARAGRAPHS, "He also founded a guild in Lindorf.")
    message = f"Context:\n\nA chunk.\n\n{TWO_PARAGRAPHS}\n\nnot A chunk.\n\nQuestion?"
    pieces = discover(message, index)
    assert [p.text if isinstance(p, Found) else p for p in pieces] == \
        ["Context:", "A chunk.", TWO_PARAGRAPHS, "not A chunk.\n\nQuestion?"]
    assert [isinstance(p, Found) for p in pieces] == [False, True, True, False]
    assert "\n\n".join(p.text if isinstance(p, Found) else p for p in pieces) == message  # exact text back


def test_discover_needs_blank_line_delimiters_and_the_same_namespace():
    index = _index("A chunk.")
    assert discover("Here is A chunk. inline", index) == ["Here is A chunk. inline"]
    assert discover("A chunk.\nQuestion?", index) == ["A chunk.\nQuestion?"]  # one newline is no delimiter
    assert all(not isinstance(p, Found) for p in discover("A chunk.", index, namespace="other"))
    assert isinstance(discover("A chunk.", index)[0], Found)


def test_index_url_is_beside_the_store():
    assert index_url("disk:/data/blocks/") == "disk:/data/blocks.text-index"
    assert index_url("redis://h:1/0") == "redis://h:1/0?prefix=ragkv%3Atext%3A"
    assert index_url("redis+cluster://a:1,b:2?prefix=x:") == "redis+cluster://a:1,b:2?prefix=x%3Atext%3A"


def test_text_index_on_redis(redis_url):
    index = TextIndex.open(redis_url, "fp")
    try:
        index.record(["one", "two\n\nthree"], [IndexedChunk("a" * 64, 1, 1), IndexedChunk("b" * 64, 3, 2)], "ns")
        assert index.find(["one", "two\n\nthree", "four"], "ns") == \
            [IndexedChunk("a" * 64, 1, 1), IndexedChunk("b" * 64, 3, 2), None]
        assert index.find(["one"]) == [None] and index.max_paragraphs() == 2
    finally:
        index.close()


def test_pasted_documents_hit_the_store(api):
    with api.sdk() as sdk:
        sdk.ingest(DOCS[:2])
    message = "Use the context.\n\n" + "\n\n".join([DOCS[1], "An unindexed note.", DOCS[0]]) + "\n\n" + QUESTION
    r = api.openai().chat.completions.create(model="default", messages=[{"role": "user", "content": message}],
                                             max_tokens=2)
    assert ragkv_of(r)["chunks_hit"] == 2 and ragkv_of(r)["chunks_computed"] == 0
    plain = api.openai().chat.completions.create(model="default", messages=[{"role": "user", "content": message}],
                                                 max_tokens=2, extra_body={"ragkv": {"discover": False,
                                                                                     "mode": "full"}})
    assert ragkv_of(plain)["prompt_token_ids"] != ragkv_of(r)["prompt_token_ids"]  # pieces tokenized on their own
    assert ragkv_of(plain)["chunks_hit"] == 0


def test_langchain_stuff_documents_prompt_hits_the_ingested_documents(api):
    """LangChain's stuffing: documents' page_content joined by blank lines into a ChatPromptTemplate, sent by
    an unmodified ChatOpenAI (only base_url set). Two of the three retrieved documents were ingested."""
    with api.sdk() as sdk:
        sdk.ingest(DOCS[1:])
    retrieved = [Document(page_content=DOCS[2]), Document(page_content="Frobnia exports salt."),
                 Document(page_content=DOCS[1])]
    prompt = ChatPromptTemplate.from_messages([
        ("system", "Answer the question using only this context."),
        ("human", "Context:\n\n{context}\n\nQuestion: {question}")])
    llm = ChatOpenAI(base_url=api.base_url, api_key="unused", model="default", max_tokens=3, max_retries=0)
    chain = prompt | llm
    before = api.engine.stats().engine.chunks_hit
    answer = chain.invoke({"context": "\n\n".join(d.page_content for d in retrieved), "question": QUESTION})
    assert answer.content
    assert api.engine.stats().engine.chunks_hit - before == 2


@pytest.mark.parametrize("mode", ["reuse", "blend"])
def test_discovered_chunk_modes_share_the_prompt_ids(api, mode):
    message = "\n\n".join(DOCS[:2]) + "\n\n" + QUESTION
    with api.sdk() as sdk:
        sdk.ingest(DOCS[:2])
    ids = {}
    for m in ("full", mode):
        r = api.openai().chat.completions.create(model="default", messages=[{"role": "user", "content": message}],
                                                 max_tokens=1, extra_body={"ragkv": {"mode": m}})
        ids[m] = ragkv_of(r)["prompt_token_ids"]
        assert ragkv_of(r)["mode"] == m
    assert ids["full"] == ids[mode]
