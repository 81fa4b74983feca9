"""Split documents into chunk texts on token boundaries.

A chunk is a window of `chunk_tokens` token ids decoded back to text. The
service addresses a chunk by the ids of `runner.tokenize(chunk_text)` (no
BOS: every chunk is tokenized on its own, workers/prompt.py), so a batch job that ingests these texts
produces exactly the ids `Engine.ingest([chunk_text])` would. Decoding a
window and re-tokenizing it usually gives the same ids back; where a window
boundary splits a multi-token word differently the re-tokenized text is what
counts, because that is what the service will see.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

DEFAULT_CHUNK_TOKENS = 256


def chunk_text(tokenizer, text: str, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> list[str]:
    """`text` -> chunk texts of at most ~`chunk_tokens` tokens each; empty/whitespace windows dropped."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    chunks = []
    for start in range(0, len(ids), chunk_tokens):
        piece = tokenizer.decode(ids[start:start + chunk_tokens], skip_special_tokens=False)
        if piece.strip():
            chunks.append(piece)
    return chunks


def read_corpus(root: str | Path) -> Iterator[tuple[str, str]]:
    """(source, text) for every *.txt file and every `text` field of *.jsonl lines under `root`, sorted."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus directory {root} does not exist")
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file()):
        if path.suffix == ".txt":
            yield str(path), path.read_text(encoding="utf-8")
            continue
        with path.open(encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                text = json.loads(line).get("text")
                if isinstance(text, str) and text.strip():
                    yield f"{path}:{line_no}", text
