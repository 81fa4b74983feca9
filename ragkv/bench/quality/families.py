"""Task families of the quality suite: one small generator per family, registered by name.

A generator gets a `Draw` (the split's pool, a seeded rng, the prompt's shape and where the fact
goes) and returns the chunks, question and expected answers. Every answer is checkable: the
prompt is correct when each expected answer appears in the model's text.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable

from kvstore.registry import add_unique
from ragkv.bench.quality.haystack import CountTokens, build_chunk, scatter_chunk
from ragkv.bench.quality.pools import Pool



@dataclass(frozen=True)
class QualityPrompt:
    family: str
    split: str
    index: int
    system_prompt: str
    chunks: tuple[str, ...]
    question: str
    answers: tuple[str, ...]  # every one must appear in the answer text
    max_new_tokens: int = 24
    position: str = ""  # first | middle | last: which chunk holds the fact
    depth: float = 0.0  # where in that chunk
    chunk: int | None = None  # the index of that chunk (Draw.target)

    def correct(self, text: str) -> bool:
        return all(answer_found(a, text) for a in self.answers)


def answer_found(answer: str, text: str) -> bool:
    """Digits match as a whole number; words case-insensitively on word boundaries."""
    if answer.isdigit():
        return re.search(rf"(?<!\d){answer}(?!\d)", text) is not None
    return re.search(rf"\b{re.escape(answer.lower())}\b", text.lower()) is not None


@dataclass
class Draw:
    """One prompt's random choices. `target` = index of the chunk that holds the fact."""

    rng: random.Random
    pool: Pool
    num_chunks: int
    chunk_tokens: int
    target: int
    depth: float
    count_tokens: CountTokens
    index: int = 0  # the prompt's index in its family: balanced choices cycle over it
    _codes: set[str] = field(default_factory=set)

    def code(self) -> str:
        while True:
            code = str(self.rng.randrange(10000, 100000))
            if code not in self._codes:
                self._codes.add(code)
                return code

    def answer_kind(self) -> str:
        """`number` or `word` by turns, the turn shifted every `num_chunks` prompts (so in a family whose fact
        cycles over the chunks, each kind meets every chunk)."""
        return ("number", "word")[(self.index + self.index // self.num_chunks) % 2]

    def people(self, count: int) -> list[str]:
        """`count` distinct people with plain surnames (the first of each near-identical group)."""
        return self.rng.sample([f"{g} {group[0]}" for g in self.pool.given_names for group in self.pool.surnames],
                               count)

    def entities(self, count: int) -> list[str]:
        return self.rng.sample(self.pool.entities, count)

    def kind(self) -> str:
        return self.rng.choice(self.pool.kinds)

    def chunks(self, facts: dict[int, list[str]], style: str = "prose") -> tuple[str, ...]:
        """One chunk per index; the target chunk's facts at `depth`, the others' at random depths."""
        out = []
        for i in range(self.num_chunks):
            depth = self.depth if i == self.target else self.rng.random()
            out.append(build_chunk(self.rng, self.pool, style, facts.get(i, []), depth,
                                   self.chunk_tokens, self.count_tokens))
        return tuple(out)

    def deal(self, facts: list[str], per_chunk: int) -> dict[int, list[str]]:
        """facts[0] to the target chunk, the others `per_chunk` to a chunk in a random order."""
        slots = [i for i in range(self.num_chunks) for _ in range(per_chunk)]
        slots.remove(self.target)
        self.rng.shuffle(slots)
        dealt: dict[int, list[str]] = {}
        for chunk, fact in zip([self.target, *slots], facts):
            dealt.setdefault(chunk, []).append(fact)
        return dealt

    def scattered(self, facts: dict[int, list[str]], asked: str) -> tuple[str, ...]:
        """One prose chunk per index, each fact at its own random depth, `asked` at `depth`. Chunks come out
        within half a filler sentence of their size, SCATTER_EXTRA tokens over `chunk_tokens` on average (an
        8-chunk prompt: ~1,030-1,100 tokens, the held-out RAG prompts' length)."""
        return tuple(scatter_chunk(self.rng, self.pool, "prose",
                                   [(self.depth if f == asked else self.rng.random(), f) for f in facts.get(i, [])],
                                   self.chunk_tokens + SCATTER_EXTRA, self.count_tokens)
                     for i in range(self.num_chunks))

    def others(self) -> list[int]:
        return [i for i in range(self.num_chunks) if i != self.target]

    def spread(self, count: int) -> list[int]:
        """Chunks for `count` facts: the target's first, then the other chunks in turn."""
        others = self.others() or [self.target]
        return [self.target] + [others[n % len(others)] for n in range(count - 1)]


@dataclass(frozen=True)
class Task:
    chunks: tuple[str, ...]
    question: str
    answers: tuple[str, ...]
    system_prompt: str = ""
    max_new_tokens: int = 24


@dataclass(frozen=True)
class Family:
    name: str
    description: str  # one line, for the README
    make: Callable[[Draw], Task]
    min_chunks: int = 1
    every_position: bool = False  # the fact's chunk cycles over every position, not first / middle / last


FAMILIES: dict[str, Family] = {}
SCATTER_EXTRA = 3  # tokens a scattered chunk adds to its size


def family(name: str, description: str, min_chunks: int = 1, every_position: bool = False):
    def add(make: Callable[[Draw], Task]) -> Callable[[Draw], Task]:
        add_unique(FAMILIES, "family", name, Family(name, description, make, min_chunks, every_position))
        return make
    return add


def digit_variants(rng: random.Random, digits: str, count: int) -> list[str]:
    """`digits` and count - 1 variants, each with the same digit (never the first) changed: one apart pairwise."""
    i = rng.randrange(1, len(digits))
    others = rng.sample([c for c in "0123456789" if c != digits[i]], count - 1)
    return [digits] + [digits[:i] + c + digits[i + 1:] for c in others]


def _side_fact(d: Draw, entity: str, kind: str) -> str:
    """A fact about another entity that is not a code (so only one code is in the prompt)."""
    pool = d.pool
    if d.rng.random() < 0.5:
        return pool.attributes[2][1].format(entity=entity, kind=kind, value=d.rng.choice(pool.colours))
    return pool.attributes[3][1].format(entity=entity, kind=kind, value=d.rng.choice(pool.places))


def _code_fact(d: Draw, entity: str, kind: str, code: str) -> str:
    return d.rng.choice(d.pool.code_fact).format(entity=entity, kind=kind, code=code)


def _code_question(d: Draw, entity: str, kind: str) -> str:
    return d.rng.choice(d.pool.code_question).format(entity=entity, kind=kind)


def _one_needle(d: Draw, style: str) -> Task:
    """One code fact in a `style` haystack, asked by its entity."""
    entity, kind, code = d.entities(1)[0], d.kind(), d.code()
    chunks = d.chunks({d.target: [_code_fact(d, entity, kind, code)]}, style=style)
    return Task(chunks, _code_question(d, entity, kind), (code,))


@family("single_needle", "RULER NIAH single: one code in repeated noise sentences, asked by its entity")
def single_needle(d: Draw) -> Task:
    return _one_needle(d, style="noise")


@family("multi_key", "RULER multikey: codes of four entities, same template, in different chunks; one asked")
def multi_key(d: Draw) -> Task:
    kind = d.kind()
    holders = [d.target] + d.rng.sample(d.others(), min(3, len(d.others())))
    names = d.entities(len(holders))
    codes = [d.code() for _ in names]
    facts = {chunk: [_code_fact(d, names[n], kind, codes[n])] for n, chunk in enumerate(holders)}
    return Task(d.chunks(facts), _code_question(d, names[0], kind), (codes[0],))


@family("multi_value", "RULER multivalue: several attributes of one entity, others' alike elsewhere; one asked")
def multi_value(d: Draw) -> Task:
    kind, pool = d.kind(), d.pool
    names = d.entities(min(d.num_chunks, 4))
    asked = d.rng.randrange(len(pool.attributes))
    facts: dict[int, list[str]] = {}
    answer = ""
    for name, chunk in zip(names, d.spread(len(names))):
        values = [d.rng.choice(pool.people), d.code(), d.rng.choice(pool.colours), d.rng.choice(pool.places)]
        lines = [template.format(entity=name, kind=kind, value=v) for (_, template, _), v in zip(pool.attributes, values)]
        facts.setdefault(chunk, []).append(" ".join(lines))
        if not answer:
            answer = values[asked]
    question = pool.attributes[asked][2].format(entity=names[0], kind=kind)
    return Task(d.chunks(facts), question, (answer,))


@family("multi_query", "RULER multiquery: the codes of two entities, in different chunks, asked in one question",
        min_chunks=2)
def multi_query(d: Draw) -> Task:
    kind = d.kind()
    holders = [d.target, d.rng.choice(d.others())]
    names = d.entities(d.num_chunks)
    codes = [d.code() for _ in holders]
    facts = {chunk: [_code_fact(d, names[n], kind, codes[n])] for n, chunk in enumerate(holders)}
    for i in range(d.num_chunks):
        facts.setdefault(i, [_side_fact(d, names[i], kind)])
    question = d.pool.pair_question.format(a=names[0], b=names[1], kind=kind)
    return Task(d.chunks(facts), question, tuple(codes), max_new_tokens=40)


@family("near_duplicate", "overlapping retrieved passages: each chunk repeats half of its neighbour's text; "
        "one code, in two chunks", min_chunks=2)
def near_duplicate(d: Draw) -> Task:
    kind, code = d.kind(), d.code()
    names = d.entities(d.num_chunks + 1)
    # halves h_0..h_N, chunk i = h_i + h_{i+1}: every half (so every fact) is in two chunks but the first
    # and last; half `target` holds the code, the others facts about other entities that are not codes
    halves = []
    for i in range(d.num_chunks + 1):
        fact = _code_fact(d, names[i], kind, code) if i == d.target else _side_fact(d, names[i], kind)
        depth = d.depth if i == d.target else d.rng.random()
        halves.append(build_chunk(d.rng, d.pool, "prose", [fact], depth, d.chunk_tokens // 2, d.count_tokens))
    chunks = tuple(halves[i] + " " + halves[i + 1] for i in range(d.num_chunks))
    return Task(chunks, _code_question(d, names[d.target], kind), (code,))


@family("cross_chunk", "a fact split across a chunk boundary: entity ends one chunk, its code opens the next",
        min_chunks=2)
def cross_chunk(d: Draw) -> Task:
    kind, pool = d.kind(), d.pool
    target = min(d.target, d.num_chunks - 2)  # the code opens the chunk after the one that names the entity
    names = d.entities(d.num_chunks)
    codes = [d.code() for _ in names]
    distractor = d.rng.choice([i for i in range(d.num_chunks) if i not in (target, target + 1)] or [-1])
    chunks = []
    for i in range(d.num_chunks):
        head = [codes[target] + "."] if i == target + 1 else []
        tail = [pool.split_fact.format(entity=names[target], kind=kind)] if i == target else []
        # one other code in the prompt (a distractor of the same kind), side facts elsewhere
        own = [] if i in (target, target + 1) else [
            _code_fact(d, names[i], kind, codes[i]) if i == distractor else _side_fact(d, names[i], kind)]
        body = build_chunk(d.rng, pool, "prose", own, d.rng.random(), d.chunk_tokens - 10,
                           d.count_tokens)
        chunks.append(" ".join(head + [body] + tail))
    return Task(tuple(chunks), _code_question(d, names[target], kind), (codes[target],))


@family("system_prompt", "the answer is only in the system prompt (a persona's name or an instruction's code)")
def system_prompt(d: Draw) -> Task:
    pool, kind = d.pool, d.kind()
    names = d.entities(d.num_chunks + 1)
    facts = {i: [_code_fact(d, names[i + 1], kind, d.code())] for i in range(d.num_chunks)}
    if d.rng.random() < 0.5:
        person = d.rng.choice(pool.people)
        system = pool.persona.format(person=person, entity=names[0], kind=kind, place=d.rng.choice(pool.places))
        return Task(d.chunks(facts), pool.persona_question, (person.split()[0],), system_prompt=system)
    code = d.code()
    return Task(d.chunks(facts), pool.duty_question, (code,), system_prompt=pool.duty.format(code=code))


@family("table", "a list of records, one line per entity with its code; one entity's code asked")
def table(d: Draw) -> Task:
    kind, pool = d.kind(), d.pool
    names = d.entities(min(4, d.num_chunks))
    facts: dict[int, list[str]] = {}
    codes = [d.code() for _ in names]
    for n, (name, chunk) in enumerate(zip(names, d.spread(len(names)))):
        facts.setdefault(chunk, []).append(pool.record.format(entity=name, kind=kind, code=codes[n],
                                                              town=d.rng.choice(pool.places)))
    return Task(d.chunks(facts, style="table"), pool.table_question.format(entity=names[0], kind=kind), (codes[0],))


@family("code", "configuration-like code lines, one per site; one site's number asked")
def code(d: Draw) -> Task:
    pool = d.pool
    holders = [d.target] + d.rng.sample(d.others(), min(3, len(d.others())))
    keys = [f"{n.lower()}_{d.kind()}" for n in d.entities(len(holders))]
    codes = [d.code() for _ in holders]
    facts = {chunk: [pool.code_line.format(key=keys[n], code=codes[n])] for n, chunk in enumerate(holders)}
    return Task(d.chunks(facts, style="code"), pool.config_question.format(key=keys[0]), (codes[0],))


@family("prose_needle", "one code fact in narrative prose about the pool's people (who did what, where, when)")
def prose_needle(d: Draw) -> Task:
    return _one_needle(d, style="story")


@family("passkey", "legacy eviction bench: a pass key said twice in noise, the question announces it")
def passkey(d: Draw) -> Task:
    key = d.code()
    needle = d.pool.passkey_needle.format(key=key)
    return Task(d.chunks({d.target: [needle]}, style="noise"), d.pool.passkey_question, (key,),
                system_prompt=d.pool.assistant, max_new_tokens=14)


@family("archive_code", "legacy blend bench: the prompt's only code, other chunks hold other kinds of facts")
def archive_code(d: Draw) -> Task:
    kind = d.kind()
    names = d.entities(d.num_chunks)
    code = d.code()
    facts = {i: [_code_fact(d, names[i], kind, code) if i == d.target else _side_fact(d, names[i], kind)]
             for i in range(d.num_chunks)}
    return Task(d.chunks(facts), _code_question(d, names[d.target], kind), (code,))


# -- dense distractors: many people or items with the same attribute, the question names one ----------------
# the density below was set on `dev` (full prefill's accuracy near the held-out RAG prompts': 0.45-0.65)
DENSE_PER_CHUNK = 2  # shared_attribute: people per chunk (16 in an 8-chunk prompt)
NEAR_PER_CHUNK = 1  # near_names: facts per chunk, in groups of NEAR_GROUP near-identical names
NEAR_GROUP = 2


def _attribute(d: Draw, count: int) -> tuple[tuple[str, str], list[str]]:
    """The attribute every person of the prompt has and `count` distinct values: numbers or words by turns."""
    if d.answer_kind() == "number":
        return d.pool.number_attribute, [d.code() for _ in range(count)]
    return d.pool.name_attribute, d.rng.sample(d.pool.labels, count)


@family("shared_attribute", "dense distractors: two people a chunk, all with the same attribute (a number "
        "or a word); one asked")
def shared_attribute(d: Draw) -> Task:
    people = d.people(d.num_chunks * DENSE_PER_CHUNK)
    (fact, question), values = _attribute(d, len(people))
    facts = [fact.format(person=p, value=v) for p, v in zip(people, values)]
    return Task(d.scattered(d.deal(facts, DENSE_PER_CHUNK), facts[0]), question.format(person=people[0]),
                (values[0],))


@family("any_position", "one person a chunk, each with the same attribute (a number or a word) and a side "
        "fact; the asked person's chunk cycles over every position", every_position=True)
def any_position(d: Draw) -> Task:
    pool, people = d.pool, d.people(d.num_chunks)
    (fact, question), values = _attribute(d, len(people))
    facts = {i: [fact.format(person=p, value=values[i]),
                 d.rng.choice(pool.profile).format(person=p, place=d.rng.choice(pool.places))]
             for i, p in enumerate(people)}
    return Task(d.scattered(facts, facts[d.target][0]), question.format(person=people[d.target]),
                (values[d.target],))


def _near_groups(d: Draw, count: int, make_group) -> list[str]:
    """`count` names in groups of NEAR_GROUP near-identical ones (each group from `make_group()`), shuffled
    inside each group so that the asked name (the first) is any of its group's variants."""
    names: list[str] = []
    while len(names) < count:
        group = make_group()
        if set(group) & set(names):  # a serial drawn twice: the question would be ambiguous
            continue
        d.rng.shuffle(group)
        names += group
    return names[:count]


def _namesakes(given: str, surnames: list[str]) -> list[str]:
    return [f"{given} {s}" for s in surnames]


def _serials(d: Draw) -> list[str]:
    """NEAR_GROUP serials PREFIX-DDDD one digit apart."""
    prefix = d.rng.choice(d.pool.item_prefixes)
    return [f"{prefix}-{v}" for v in digit_variants(d.rng, str(d.rng.randrange(1000, 10000)), NEAR_GROUP)]


@family("near_names", "near-identical names: pairs of people whose surnames differ by one letter (numbers as "
        "values), or of serials one digit apart (words as values), one a chunk; one asked", min_chunks=2)
def near_names(d: Draw) -> Task:
    pool, count = d.pool, d.num_chunks * NEAR_PER_CHUNK
    if d.answer_kind() == "number":
        surnames = iter(d.rng.sample(pool.surnames, len(pool.surnames)))
        names = _near_groups(d, count, lambda: _namesakes(d.rng.choice(pool.given_names),
                                                          d.rng.sample(next(surnames), NEAR_GROUP)))
        values = [d.code() for _ in names]
        fact, question = pool.number_attribute
        facts = [fact.format(person=n, value=v) for n, v in zip(names, values)]
        question = question.format(person=names[0])
    else:
        names = _near_groups(d, count, lambda: _serials(d))
        values = d.rng.sample(pool.labels, count)
        fact, question = pool.item_fact
        facts = [fact.format(item=n, value=v) for n, v in zip(names, values)]
        question = question.format(item=names[0])
    return Task(d.scattered(d.deal(facts, NEAR_PER_CHUNK), facts[0]), question, (values[0],))
