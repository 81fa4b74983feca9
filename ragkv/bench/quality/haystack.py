"""Haystacks: the text a fact hides in, built to a token target from one split's pool.

Styles: `prose` (the pool's fictional town sentences), `noise` (RULER's repeated noise), `docs` (real
English technical prose: Python's language reference, shipped with Python), `table` (pipe-separated
rows about other entities), `code` (configuration-like lines). Facts are inserted at a depth in [0, 1].
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from typing import Callable

from ragkv.bench.quality.pools import Pool

CountTokens = Callable[[str], int]
STYLES = ("prose", "noise", "docs", "table", "code")


@lru_cache(maxsize=2)
def _doc_sentences(split_index: int) -> tuple[str, ...]:
    """Sentences of pydoc topics: dev takes topics a-m, test n-z (no shared sentence)."""
    import pydoc_data.topics as topics

    names = sorted(name for name in topics.topics if (name[0] <= "m") == (split_index == 0))
    text = " ".join(topics.topics[name] for name in names)
    text = re.sub(r"\s+", " ", re.sub(r"[*`|>]+", " ", text))
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text)]
    return tuple(s for s in sentences if 40 <= len(s) <= 220 and not re.search(r"\d{3,}", s))


def filler_sentence(rng: random.Random, pool: Pool, style: str, split_index: int) -> str:
    if style == "prose":
        return rng.choice(pool.filler).format(place=rng.choice(pool.places))
    if style == "noise":
        return pool.noise[0]
    if style == "docs":
        return rng.choice(_doc_sentences(split_index))
    if style == "table":
        return f"- {rng.choice(pool.places)} office: {rng.randrange(12, 95)} shelves, run by {rng.choice(pool.people)}"
    if style == "code":
        key = rng.choice(pool.places).lower().replace(" ", "_")
        return f'{key}_shelves = {rng.randrange(12, 95)}  # colour: {rng.choice(pool.colours)}'
    raise ValueError(f"unknown haystack style {style!r}; expected one of {STYLES}")


def joiner(style: str) -> str:
    return "\n" if style in ("table", "code") else " "


def build_chunk(rng: random.Random, pool: Pool, style: str, split_index: int, facts: list[str], depth: float,
                tokens: int, count_tokens: CountTokens) -> str:
    """About `tokens` tokens of `style` filler with `facts` inserted together at `depth` (0 = start)."""
    sep = joiner(style)
    budget = tokens - count_tokens(sep.join(facts)) if facts else tokens
    sentences: list[str] = []
    while count_tokens(sep.join(sentences)) < budget - 8:
        sentences.append(filler_sentence(rng, pool, style, split_index))
        if len(sentences) > 400:
            break
    at = int(round(depth * len(sentences)))
    return sep.join(sentences[:at] + list(facts) + sentences[at:])
