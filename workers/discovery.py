"""Discovery: the ingested chunks a message pastes, found by exact text through the store's TextIndex.

A chunk is found where its exact text sits in a message between two blank lines ("\\n\\n"), or the
message's start or end. The message is split at its blank lines into paragraphs; every run of up
to `max_paragraphs` consecutive paragraphs (the most any indexed chunk has) is one candidate, and all
candidates are looked up at once (one hash each, one `get_many`). Left to right, the longest run found
becomes a chunk piece; the paragraphs between found chunks stay text, joined as they were. Joining
the pieces with "\\n\\n" gives back the message exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.text_index import PARAGRAPH, IndexedChunk, TextIndex

MAX_CANDIDATES = 4096  # spans looked up per message at most (a hostile message cannot make it scan)


@dataclass(frozen=True)
class Found:
    """A run of paragraphs that is an ingested chunk's exact text."""
    text: str
    chunk: IndexedChunk


def discover(text: str, index: TextIndex, namespace: str = "") -> list[str | Found]:
    """`text` as pieces: plain text (str) and found chunks (Found), in order; "\\n\\n".join gives it back."""
    paragraphs = text.split(PARAGRAPH)
    longest = min(index.max_paragraphs(), len(paragraphs))
    if longest < 1:
        return [text]
    spans = [(i, j) for i in range(len(paragraphs)) if paragraphs[i].strip()
             for j in range(i + 1, min(i + longest, len(paragraphs)) + 1)][:MAX_CANDIDATES]
    hits = index.find([PARAGRAPH.join(paragraphs[i:j]) for i, j in spans], namespace)
    longest_at: dict[int, tuple[int, IndexedChunk]] = {}
    for (i, j), hit in zip(spans, hits):
        if hit is not None and j > longest_at.get(i, (0, None))[0]:
            longest_at[i] = (j, hit)
    pieces: list[str | Found] = []
    plain: list[str] = []
    i = 0
    while i < len(paragraphs):
        if i not in longest_at:
            plain.append(paragraphs[i])
            i += 1
            continue
        if plain:
            pieces.append(PARAGRAPH.join(plain))
            plain = []
        j, hit = longest_at[i]
        pieces.append(Found(PARAGRAPH.join(paragraphs[i:j]), hit))
        i = j
    if plain:
        pieces.append(PARAGRAPH.join(plain))
    return pieces
