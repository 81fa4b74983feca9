"""TextIndex: ingested chunk texts by hash -> the chunk's block, so a prompt that pastes a chunk finds it.

One small entry per (model fingerprint, namespace, exact chunk text), written at ingest; finding a
text is one key lookup (all of a prompt's candidate spans in one `get_many`), no scan and no model
work. The entries live in a backend of their own beside the block store (`index_url`), so the block
store's keys, sizes and budgets stay blocks only:

    disk:PATH                    -> disk:PATH.text-index
    redis://...?prefix=P          -> the same server, prefix P + "text:" (default "ragkv:text:")
    redis+cluster://...?prefix=P  -> likewise, spread over the cluster's buckets
    memory:                       -> memory: (this process only)

An entry is a hint: the engine still reads the block by its address and recomputes it when the block
is gone. One more key per fingerprint keeps the largest paragraph count of an indexed text (paragraphs
are separated by a blank line, "\\n\\n"), which bounds the spans a prompt has to look up.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from kvstore.backends.base import Backend, BackendError
from kvstore.backends.registry import open_backend, url_scheme

log = logging.getLogger(__name__)

PARAGRAPH = "\n\n"  # what delimits a chunk inside a message: a blank line
INDEX_SUFFIX = ".text-index"
INDEX_PREFIX = "text:"
DEFAULT_REDIS_PREFIX = "ragkv:"


@dataclass(frozen=True)
class IndexedChunk:
    id: str  # the block's content address
    num_tokens: int
    paragraphs: int  # blank-line-separated paragraphs in the text
    compression: dict | None = None  # the spec it was ingested with (its block namespace), None: whole


def paragraph_count(text: str) -> int:
    return text.count(PARAGRAPH) + 1


def index_url(store_url: str) -> str:
    """Where the text index of the block store at `store_url` lives (see the module docstring)."""
    scheme = url_scheme(store_url)
    if scheme == "disk":
        return store_url.rstrip("/") + INDEX_SUFFIX
    if scheme == "memory":
        return store_url
    parts = urlsplit(store_url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query["prefix"] = query.get("prefix", DEFAULT_REDIS_PREFIX) + INDEX_PREFIX
    return urlunsplit(parts._replace(query=urlencode(query)))


class TextIndex:
    def __init__(self, backend: Backend, fingerprint: str):
        self.backend = backend
        self.fingerprint = fingerprint
        self._max_key = "m" + hashlib.sha256(fingerprint.encode()).hexdigest()

    @classmethod
    def open(cls, store_url: str, fingerprint: str) -> "TextIndex":
        return cls(open_backend(index_url(store_url)), fingerprint)

    def key(self, text: str, namespace: str = "") -> str:
        digest = hashlib.sha256(f"{self.fingerprint}\x00{namespace}\x00".encode())
        digest.update(text.encode("utf-8", "surrogatepass"))
        return "t" + digest.hexdigest()

    # -- writes (ingest) ------------------------------------------------------------
    def record(self, texts: Sequence[str], chunks: Sequence[IndexedChunk], namespace: str = "") -> bool:
        """Index each text as its chunk; False (logged) when the index backend is down: ingest goes on."""
        try:
            self.backend.put_many([(self.key(t, namespace), _encode(c)) for t, c in zip(texts, chunks)])
            most = max((c.paragraphs for c in chunks), default=1)
            if most > self.max_paragraphs():
                self.backend.put(self._max_key, str(most).encode())
        except BackendError as e:
            log.warning("text index not updated: %s", e)
            return False
        return True

    # -- reads (discovery) --------------------------------------------------------------
    def max_paragraphs(self) -> int:
        """The largest paragraph count of an indexed text (0: nothing indexed, or the index is down)."""
        try:
            raw = self.backend.get(self._max_key)
        except BackendError:
            return 0
        return int(raw) if raw and raw.isdigit() else 0

    def find(self, texts: Sequence[str], namespace: str = "") -> list[IndexedChunk | None]:
        """Each text's indexed chunk, or None; all None when the index backend is down."""
        if not texts:
            return []
        try:
            raws = self.backend.get_many([self.key(t, namespace) for t in texts])
        except BackendError as e:
            log.warning("text index unavailable: %s", e)
            return [None] * len(texts)
        return [_decode(raw) for raw in raws]

    def close(self) -> None:
        self.backend.close()


def _encode(chunk: IndexedChunk) -> bytes:
    return json.dumps({"id": chunk.id, "num_tokens": chunk.num_tokens, "paragraphs": chunk.paragraphs,
                       "compression": chunk.compression}, sort_keys=True).encode()


def _decode(raw: bytes | None) -> IndexedChunk | None:
    if raw is None:
        return None
    try:
        row = json.loads(raw)
        return IndexedChunk(str(row["id"]), int(row["num_tokens"]), int(row["paragraphs"]), row.get("compression"))
    except (ValueError, KeyError, TypeError):  # a damaged entry is a miss
        return None
