"""Request streams for `ragkv bench blend`: the ways real RAG traffic reuses chunks.

- `same_documents`: N sets of 8 documents, each asked two different questions. The first request warms
  the store; the second ("same documents, another question", the commonest RAG pattern) is the one to
  measure.
- `zipf_requests`: a pool of ~40 chunks with Zipf popularity. Each request retrieves 8 of them by a
  popularity draw and orders them by a retriever-like score (popularity times a little noise), so popular
  chunks lead and requests share their leading chunks: what a prefix tree of chunk sequences reuses.

The documents are dense distractors built as the quality suite's `shared_attribute` family builds them
(families.py `Draw`, a split's vocabulary), denser: PEOPLE_PER_CHUNK people a chunk, every one with a 5-digit
badge number; a question names one person and its answer is that number. Deterministic per seed; plain
data out, no model.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ragkv.bench.quality.families import Draw
from ragkv.bench.quality.haystack import CountTokens
from ragkv.bench.quality.pools import POOLS

PEOPLE_PER_CHUNK = 3


@dataclass(frozen=True)
class Request:
    question: str
    chunks: tuple[str, ...]  # in prompt order
    answer: str  # a 5-digit number; correct when the answer text contains it (families.answer_found)
    chunk_ids: tuple[int, ...] = ()  # zipf_requests: each chunk's index in the pool (0 = most popular)


@dataclass(frozen=True)
class Fact:
    chunk: int  # which chunk states it
    question: str
    answer: str


def _documents(rng: random.Random, num_chunks: int, chunk_tokens: int, count_tokens: CountTokens, split: str,
               target: int = 0) -> tuple[tuple[str, ...], list[Fact]]:
    """`num_chunks` chunks, PEOPLE_PER_CHUNK badge-number facts each (people distinct, numbers distinct)."""
    draw = Draw(rng, POOLS[split], num_chunks, chunk_tokens, target, rng.random(), count_tokens)
    fact, question = draw.pool.number_attribute
    people = draw.people(num_chunks * PEOPLE_PER_CHUNK)
    codes = [draw.code() for _ in people]
    texts = [fact.format(person=p, value=c) for p, c in zip(people, codes)]
    dealt = draw.deal(texts, PEOPLE_PER_CHUNK)
    where = {text: chunk for chunk, held in dealt.items() for text in held}
    facts = [Fact(where[t], question.format(person=p), c) for t, p, c in zip(texts, people, codes)]
    return draw.scattered(dealt, texts[0]), facts


def same_documents(count: int, count_tokens: CountTokens, num_chunks: int = 8, chunk_tokens: int = 122,
                   split: str = "dev", seed: int = 0) -> list[tuple[Request, Request]]:
    """`count` pairs (first, second): the same chunks in the same order, two questions about two people in
    different chunks. The asked chunks cycle over every position."""
    pairs = []
    for n in range(count):
        rng = random.Random(f"same-documents/{split}/{seed}/{n}")
        chunks, facts = _documents(rng, num_chunks, chunk_tokens, count_tokens, split, target=n % num_chunks)
        first = facts[0]  # in chunk n % num_chunks
        second = rng.choice([f for f in facts if f.chunk != first.chunk])
        pairs.append((Request(first.question, chunks, first.answer), Request(second.question, chunks, second.answer)))
    return pairs


def zipf_popularity(pool_size: int, exponent: float) -> list[float]:
    """Probabilities of chunks 0..pool_size-1, chunk r's proportional to 1 / (r + 1) ** exponent."""
    weights = [1.0 / (r + 1) ** exponent for r in range(pool_size)]
    total = sum(weights)
    return [w / total for w in weights]


def retrieve(rng: random.Random, popularity: list[float], k: int, noise: float) -> list[int]:
    """k distinct chunk indices drawn by popularity (without replacement), ordered by a retriever-like score:
    log popularity plus Gaussian noise (`noise` = its sd), highest first."""
    chosen: list[int] = []
    remaining = list(range(len(popularity)))
    for _ in range(k):
        pick = rng.choices(remaining, weights=[popularity[i] for i in remaining])[0]
        remaining.remove(pick)
        chosen.append(pick)
    score = {i: math.log(popularity[i]) + rng.gauss(0.0, noise) for i in chosen}
    return sorted(chosen, key=lambda i: -score[i])


def zipf_requests(count: int, count_tokens: CountTokens, pool_size: int = 40, per_request: int = 8,
                  chunk_tokens: int = 122, exponent: float = 1.0, noise: float = 0.5, split: str = "dev",
                  seed: int = 0) -> list[Request]:
    """`count` requests over one pool of `pool_size` chunks (index 0 the most popular): each retrieves
    `per_request` chunks (`retrieve`) and asks about a person in one of them, chosen uniformly."""
    rng = random.Random(f"zipf/{split}/{seed}")
    pool, facts = _documents(rng, pool_size, chunk_tokens, count_tokens, split)
    popularity = zipf_popularity(pool_size, exponent)
    requests = []
    for _ in range(count):
        ids = retrieve(rng, popularity, per_request, noise)
        asked = rng.choice([f for f in facts if f.chunk in ids])
        requests.append(Request(asked.question, tuple(pool[i] for i in ids), asked.answer, tuple(ids)))
    return requests


def leading_overlap(requests: list[Request]) -> list[int]:
    """Per request: the longest run of leading chunks (same chunks, same order) it shares with any earlier
    request, i.e. the chunks a prefix tree of chunk sequences could serve exactly (0 for the first)."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for request in requests:
        chunks = request.chunks
        out.append(max((k for k in range(1, len(chunks) + 1) if chunks[:k] in seen), default=0))
        seen.update(chunks[:k] for k in range(1, len(chunks) + 1))
    return out
