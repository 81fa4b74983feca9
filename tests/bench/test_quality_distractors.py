"""The dense-distractor families of the quality suite: many people or items with the same attribute, the
asked one anywhere, near-identical names. Generators only (the real tokenizer for lengths, no forward)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from ragkv.bench.quality.families import DENSE_PER_CHUNK, FAMILIES, NEAR_GROUP, answer_found
from ragkv.bench.quality.pools import POOLS
from ragkv.bench.quality.prompts import make_prompts

DENSE = ["shared_attribute", "any_position", "near_names"]
PER_FAMILY = 16  # two turns of the 8 chunk positions


def count_words(text: str) -> int:  # a tokenizer-free stand-in: the prompt shapes need only a count
    return len(text.split()) * 4 // 3


@pytest.fixture(scope="module")
def dense():
    return {split: make_prompts(split, count_words, DENSE, per_family=PER_FAMILY) for split in POOLS}


def by_family(prompts, name):
    return [p for p in prompts if p.family == name]


def near(a: str, b: str) -> bool:
    """One substitution apart (the same length, one character differs)."""
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1


def test_registered_and_in_the_default_run():
    assert set(DENSE) <= set(FAMILIES)
    families = {p.family for p in make_prompts("dev", count_words, per_family=1, sizes=(500,))}
    assert set(DENSE) <= families  # `ragkv bench quality --split dev` runs them


def test_deterministic_per_seed(dense):
    again = make_prompts("dev", count_words, DENSE, per_family=PER_FAMILY)
    assert again == dense["dev"]
    assert len({p.chunks for p in dense["dev"]}) == len(dense["dev"])  # every prompt its own draw


def test_splits_balanced_and_disjoint(dense):
    dev, test = dense["dev"], dense["test"]
    shape = lambda p: (p.family, p.index, p.chunk, p.position, p.depth, len(p.chunks), p.answers[0].isdigit())  # noqa: E731
    assert [shape(p) for p in dev] == [shape(p) for p in test]  # the same prompt shapes, answer kinds included
    for name in DENSE:  # numbers and names by turns
        assert Counter(p.answers[0].isdigit() for p in by_family(dev, name)) == {True: PER_FAMILY // 2,
                                                                                 False: PER_FAMILY // 2}
    words = lambda prompts: {w for p in prompts for w in re.findall(r"[A-Za-z][A-Za-z-]+", " ".join((*p.chunks, p.question)))}  # noqa: E731
    dev_pool, test_pool = POOLS["dev"], POOLS["test"]
    dev_names = set(dev_pool.given_names) | {s for g in dev_pool.surnames for s in g} | set(dev_pool.labels)
    test_names = set(test_pool.given_names) | {s for g in test_pool.surnames for s in g} | set(test_pool.labels)
    assert not dev_names & test_names
    assert not dev_names & words(test) and not test_names & words(dev)  # no entity or value crosses splits
    assert not {c for p in dev for c in p.chunks} & {c for p in test for c in p.chunks}


def test_answer_stated_once_in_the_recorded_chunk(dense):
    for prompts in dense.values():
        for p in prompts:
            text = " ".join(p.chunks)
            (answer,) = p.answers
            assert len(re.findall(rf"(?<![\w-]){re.escape(answer)}(?![\w-])", text)) == 1, (p.family, answer)
            assert answer_found(answer, p.chunks[p.chunk]), (p.family, p.index, p.chunk)
            assert p.position == ("first" if p.chunk == 0 else "last" if p.chunk == len(p.chunks) - 1 else "middle")
            assert p.correct(f"The answer is {answer}.") and not p.correct("I do not know.")


def test_any_position_covers_every_chunk_evenly(dense):
    for prompts in dense.values():
        chunks = Counter(p.chunk for p in by_family(prompts, "any_position"))
        assert chunks == {i: PER_FAMILY // 8 for i in range(8)}
        kinds = Counter((p.chunk, p.answers[0].isdigit()) for p in by_family(prompts, "any_position"))
        assert len(kinds) == 16  # every chunk asked once for a number and once for a name
    for name in ("shared_attribute", "near_names"):  # the suite's first / middle / last sweep
        assert {p.position for p in by_family(dense["dev"], name)} == {"first", "middle", "last"}


def test_distractors_are_dense(dense):
    for split, prompts in dense.items():
        pool = POOLS[split]
        number_fact = re.escape(pool.number_attribute[0]).replace(r"\{person\}", r"([A-Z]\w+ [A-Z]\w+)")
        number_fact = number_fact.replace(r"\{value\}", r"(\d{5})")
        name_fact = re.escape(pool.name_attribute[0]).replace(r"\{person\}", r"([A-Z]\w+ [A-Z]\w+)")
        name_fact = name_fact.replace(r"\{value\}", r"([A-Z][\w-]+)")
        for p in by_family(prompts, "shared_attribute"):  # 16 people, one attribute, all values distinct
            fact = number_fact if p.answers[0].isdigit() else name_fact
            facts = re.findall(fact, " ".join(p.chunks))
            n = 8 * DENSE_PER_CHUNK
            assert len(facts) == n and len({v for _, v in facts}) == n and len({name for name, _ in facts}) == n
            assert [len(re.findall(fact, c)) for c in p.chunks] == [DENSE_PER_CHUNK] * 8
        for p in by_family(prompts, "any_position"):  # every chunk: one person, the same attribute
            fact = number_fact if p.answers[0].isdigit() else name_fact
            assert [len(re.findall(fact, c)) for c in p.chunks] == [1] * 8


def test_near_names_have_near_identical_neighbours(dense):
    for pool in POOLS.values():
        assert all(near(a, b) for group in pool.surnames for a in group for b in group if a != b)
    for split, prompts in dense.items():
        pool = POOLS[split]
        for p in by_family(prompts, "near_names"):
            text = " ".join(p.chunks)
            if p.answers[0].isdigit():  # people one letter apart
                asked = re.search(r"of ([A-Z]\w+ [A-Z]\w+)\?|to ([A-Z]\w+ [A-Z]\w+)\?", p.question)
                person = next(g for g in asked.groups() if g)
                given, surname = person.split()
                siblings = {s for s in re.findall(rf"\b{given} ([A-Z]\w+)", text) if near(s, surname)}
                assert len(siblings) == NEAR_GROUP - 1, (p.question, siblings)
            else:  # serials one digit apart, each with its own name
                serial = re.search(r"\b[A-Z]{2}-\d{4}\b", p.question).group(0)
                serials = set(re.findall(r"\b[A-Z]{2}-\d{4}\b", text))
                assert serial in serials and sum(near(s, serial) for s in serials) == NEAR_GROUP - 1
            assert len(p.chunks) == 8 and sum(1 for c in p.chunks if re.search(r"\d", c)) == 8


def test_lengths_with_the_real_tokenizer(runner):
    """The default length: 8 chunks, ~1,030-1,100 prompt tokens with the chat template and question."""
    from workers.prompt import build_prompt

    count = lambda text: len(runner.tokenize(text))  # noqa: E731
    for split in POOLS:
        lengths = []
        for p in make_prompts(split, count, DENSE, per_family=8):
            layout = build_prompt(runner.tokenizer, p.system_prompt, [runner.tokenize(c) for c in p.chunks], p.question)
            assert len(p.chunks) == 8 and 990 <= layout.num_tokens <= 1110, (p.family, p.index, layout.num_tokens)
            lengths.append(layout.num_tokens)
        assert 1030 <= sum(lengths) / len(lengths) <= 1090
        for p in make_prompts(split, count, DENSE, per_family=2, sizes=(500,)):  # the quick size still fits
            n = build_prompt(runner.tokenizer, p.system_prompt, [runner.tokenize(c) for c in p.chunks], p.question).num_tokens
            assert len(p.chunks) == 4 and 0.8 * 500 <= n <= 1.1 * 500, (p.family, n)
