"""Prompt sets: every family × size, with the fact's chunk (first, middle, last) and depth swept.

Sizes are prompt-token targets; each maps to (chunks, tokens per chunk) so the whole prompt,
chat template and question included, lands near the target. 1,100 tokens = 8 chunks, the default
model's useful range; 2,000 is for speed runs.
"""

from __future__ import annotations

import random
import zlib

from ragkv.bench.quality.families import FAMILIES, Draw, QualityPrompt
from ragkv.bench.quality.pools import POOLS, SPLIT_SEEDS, SPLITS

SIZES: dict[int, tuple[int, int]] = {500: (4, 105), 1100: (8, 122), 2000: (8, 235)}
POSITIONS = ("first", "middle", "last")
DEPTHS = (0.1, 0.5, 0.9)


def target_chunk(position: str, num_chunks: int) -> int:
    return {"first": 0, "middle": num_chunks // 2, "last": num_chunks - 1}[position]


def position_of(chunk: int, num_chunks: int) -> str:
    return "first" if chunk == 0 else "last" if chunk == num_chunks - 1 else "middle"


def placement(index: int) -> tuple[str, float]:
    """Where prompt `index` puts its fact: a Latin square over (chunk position, depth in the chunk).

    Every 3 consecutive prompts cover all three positions and all three depths, and every 9 all nine
    pairs. (Before 2026-12-02 the depth advanced every 3 prompts, so the standard 4-per-family run put
    3 facts of 4 at depth 0.1 and none at 0.9, which flattered any method that repairs chunk starts.)"""
    return POSITIONS[index % len(POSITIONS)], DEPTHS[(index + index // len(POSITIONS)) % len(DEPTHS)]


def make_prompts(split: str, count_tokens, families: list[str] | None = None, per_family: int = 6,
                 sizes: tuple[int, ...] = (1100,)) -> list[QualityPrompt]:
    """Deterministic: the same split, families and sizes always give the same prompts."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    names = families or list(FAMILIES)
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown families {unknown}; expected some of {sorted(FAMILIES)}")
    for size in sizes:
        if size not in SIZES:
            raise ValueError(f"unknown size {size}; expected one of {sorted(SIZES)}")
    prompts = []
    for size in sizes:
        num_chunks, chunk_tokens = SIZES[size]
        for name in names:
            fam = FAMILIES[name]
            for index in range(per_family):
                position, depth = placement(index)
                target = target_chunk(position, num_chunks)
                if fam.every_position:  # the fact's chunk cycles over all of them
                    target = index % num_chunks
                    position = position_of(target, num_chunks)
                seed = SPLIT_SEEDS[split] + zlib.crc32(f"{name}/{size}/{index}".encode())
                draw = Draw(random.Random(seed), POOLS[split], max(num_chunks, fam.min_chunks),
                            chunk_tokens, target, depth, count_tokens, index=index)
                task = fam.make(draw)
                prompts.append(QualityPrompt(family=family_key(name, size, sizes), split=split, index=index,
                                             system_prompt=task.system_prompt, chunks=task.chunks,
                                             question=task.question, answers=task.answers,
                                             max_new_tokens=task.max_new_tokens, position=position, depth=depth,
                                             chunk=target))
    return prompts


def family_key(name: str, size: int, sizes: tuple[int, ...]) -> str:
    """The family's JSON key: its name, with `@SIZE` when more than one size runs."""
    return name if len(sizes) == 1 else f"{name}@{size}"
