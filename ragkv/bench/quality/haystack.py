"""Haystacks: the text a fact hides in, built to a token target from one split's pool.

Styles: `prose` (the pool's fictional town sentences), `noise` (RULER's repeated noise), `story`
(narrative sentences about the pool's people), `table` (list records about other places), `code`
(configuration-like lines). Facts are inserted at a depth in [0, 1].
"""

from __future__ import annotations

import random
from typing import Callable

from ragkv.bench.quality.pools import Pool

CountTokens = Callable[[str], int]
STYLES = ("prose", "noise", "story", "table", "code")


def story_sentence(rng: random.Random, pool: Pool) -> str:
    return (f"{rng.choice(pool.people).split()[0]} {rng.choice(pool.doings)} in {rng.choice(pool.places)} "
            f"{rng.choice(pool.times)}.")


def filler_sentence(rng: random.Random, pool: Pool, style: str) -> str:
    if style == "prose":
        return rng.choice(pool.filler).format(place=rng.choice(pool.places))
    if style == "noise":
        return pool.noise[0]
    if style == "story":
        return story_sentence(rng, pool)
    if style == "table":
        return f"- {rng.choice(pool.places)} office: {rng.randrange(12, 95)} shelves, run by {rng.choice(pool.people)}"
    if style == "code":
        key = rng.choice(pool.places).lower().replace(" ", "_")
        return f'{key}_shelves = {rng.randrange(12, 95)}  # colour: {rng.choice(pool.colours)}'
    raise ValueError(f"unknown haystack style {style!r}; expected one of {STYLES}")


def joiner(style: str) -> str:
    return "\n" if style in ("table", "code") else " "


def build_chunk(rng: random.Random, pool: Pool, style: str, facts: list[str], depth: float,
                tokens: int, count_tokens: CountTokens) -> str:
    """About `tokens` tokens of `style` filler with `facts` inserted together at `depth` (0 = start)."""
    sep = joiner(style)
    sentences = _filler(rng, pool, style, tokens - count_tokens(sep.join(facts)) if facts else tokens, count_tokens)
    at = int(round(depth * len(sentences)))
    return sep.join(sentences[:at] + list(facts) + sentences[at:])


def scatter_chunk(rng: random.Random, pool: Pool, style: str, facts: list[tuple[float, str]], tokens: int,
                  count_tokens: CountTokens) -> str:
    """About `tokens` tokens of `style` filler with each (depth, fact) inserted on its own at its depth."""
    sep = joiner(style)
    budget = tokens - count_tokens(sep.join(f for _, f in facts))
    sentences = _filler(rng, pool, style, budget - 12, count_tokens)  # up to a sentence short
    # the last sentence: of a few candidates (or none), the one that brings the chunk nearest its budget
    options = [[]] + [[filler_sentence(rng, pool, style)] for _ in range(8)]
    sentences += min(options, key=lambda extra: abs(count_tokens(sep.join(sentences + extra)) - budget))
    out, start = [], 0
    for at, n in sorted((int(round(depth * len(sentences))), n) for n, (depth, _) in enumerate(facts)):
        out += sentences[start:at] + [facts[n][1]]
        start = at
    return sep.join(out + sentences[start:])


def _filler(rng: random.Random, pool: Pool, style: str, budget: int, count_tokens: CountTokens) -> list[str]:
    sep = joiner(style)
    sentences: list[str] = []
    while count_tokens(sep.join(sentences)) < budget - 8:
        sentences.append(filler_sentence(rng, pool, style))
        if len(sentences) > 400:
            break
    return sentences
