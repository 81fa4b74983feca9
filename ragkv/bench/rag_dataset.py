"""Synthetic RAG set: a fictional fact hidden in one of N retrieved chunks, the others distractors.

The needle chunk states the access code of one fictional archive; every other
chunk states a different kind of fact about another archive (its colour, its
ledger count), so the prompt holds exactly one access code, the model cannot
answer from memory, and the answer is checked by the 5-digit code it must copy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ragkv.bench.quality.pools import DEV

NAMES = ("Heron", "Basalt", "Marigold", "Thistle", "Cobalt", "Juniper", "Quarry", "Lantern", "Saffron", "Willow",
         "Ember", "Falcon", "Garnet", "Harbor", "Indigo", "Jasper", "Kestrel", "Linden", "Meadow", "Nettle",
         "Onyx", "Pebble", "Quill", "Raven", "Sorrel", "Tamarind", "Umber", "Vesper", "Wren", "Yarrow",
         "Zephyr", "Alder", "Bramble", "Cinder", "Dune", "Elm")
PLACES = ("Pellingham", "Two Fords", "Karsk", "Lindorf", "Holt", "Grauden", "Sels", "Tessaly", "Marrow Point", "Veyl")
FILLER = DEV.filler  # the quality suite's dev sentences: this set is its `archive_code` family's ancestor


@dataclass(frozen=True)
class RagQuery:
    chunks: list[str]
    question: str
    answer: str
    needle_chunk: int


COLOURS = ("red", "ochre", "teal", "violet", "grey", "green", "white", "amber")


def _fact(name: str, code: str) -> str:
    return f"The access code for the {name} archive is {code}."


def distractor(rng: random.Random, name: str) -> str:
    if rng.random() < 0.5:
        return f"The door of the {name} archive is painted {rng.choice(COLOURS)}."
    return f"The {name} archive keeps {rng.randrange(12, 95)} ledgers on its top shelf."


def make_chunk(rng: random.Random, fact: str, count_tokens, chunk_tokens: int) -> str:
    """About chunk_tokens tokens of filler with the fact at a random sentence position."""
    sentences: list[str] = []
    while count_tokens(" ".join(sentences)) < chunk_tokens - 20:
        sentences.append(rng.choice(FILLER).format(place=rng.choice(PLACES)))
    sentences.insert(rng.randrange(len(sentences) + 1), fact)
    return " ".join(sentences)


def make_queries(num_queries: int, num_chunks: int, chunk_tokens: int, count_tokens, seed: int = 0) -> list[RagQuery]:
    rng = random.Random(seed)
    queries = []
    for _ in range(num_queries):
        names = rng.sample(NAMES, num_chunks) if num_chunks <= len(NAMES) else [f"{rng.choice(NAMES)}-{i}" for i in range(num_chunks)]
        target = rng.randrange(num_chunks)
        code = str(rng.randrange(10000, 100000))
        facts = [_fact(n, code) if i == target else distractor(rng, n) for i, n in enumerate(names)]
        chunks = [make_chunk(rng, fact, count_tokens, chunk_tokens) for fact in facts]
        queries.append(RagQuery(chunks=chunks, question=f"What is the access code for the {names[target]} archive?",
                                answer=code, needle_chunk=target))
    return queries
