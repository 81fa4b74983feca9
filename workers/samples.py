"""The sample documents and questions shipped with ragkv: the demo, examples and benches use them, and
workers/key_plan.py measures a model's key-channel plan on them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class SampleQuestion:
    question: str
    answer: str
    doc: str


def sample_documents() -> dict[str, str]:
    """name -> text, in a stable order."""
    docs = resources.files("workers") / "data" / "samples" / "docs"
    return {p.name: p.read_text().strip() for p in sorted(docs.iterdir(), key=lambda p: p.name) if p.name.endswith(".txt")}


def sample_questions() -> list[SampleQuestion]:
    raw = json.loads((resources.files("workers") / "data" / "samples" / "questions.json").read_text())
    return [SampleQuestion(**q) for q in raw]
