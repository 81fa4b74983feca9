"""Exact reuse of chunk sequences: a prefix tree of (system prompt, chunk_1, ..., chunk_k) KV.

RAGCache's idea with nano-vllm's chained addressing: the KV of a prompt's leading pieces, computed in
full (so exact, not blended), is kept as one node per piece. Node i holds the KV of piece i alone
(chunk_i and the separator after it) at its real positions, under the content address of the whole
token sequence up to its end: a node is found only when every piece before it is the same, so a
changed piece anywhere before is a miss. A later prompt that starts with the same pieces reads the
longest run of nodes and blends (or computes) only the rest.

    piece 0: the system-prompt prefix (its own block, workers/chunk_source.py)
    piece i: token_ids[spans[i-1].start : spans[i].start]   (the last: up to the question)

Nodes are stored from any exact prefill (full, prefix) of a prompt, and, for blended prompts, by an
idle-time exact prefill of the leading pieces (`fill_job`), so "same documents, another question"
is served exactly the second time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterator

import torch

from kvstore.backends.base import StoreFullError
from kvstore.kv import ChunkKV
from kvstore.store import BlockStore
from workers.cache import KVCache
from workers.idle import prefill_units
from workers.prompt import PromptLayout

log = logging.getLogger("ragkv.sequences")

SEQUENCE_NAMESPACE = "\x00sequence"  # node blocks never collide with chunk or prefix blocks
SEQUENCE_CODEC = "fp16"  # exact KV, kept in half precision (full's logits within fp16 rounding)


@dataclass(frozen=True)
class Piece:
    start: int  # [start, end) in the prompt's token ids
    end: int
    address: str  # content address of token_ids[:end]: the whole sequence up to this piece's end


@dataclass
class Head:
    """The exact KV a prompt's leading pieces have in the tree: `chunks` of its chunks, up to `end`."""

    chunks: int = 0
    end: int = 0  # first token not covered (0: nothing found)
    nodes: list[ChunkKV] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(kv.num_tokens for kv in self.nodes)


@dataclass
class SequenceCounters:
    lookups: int = 0
    hits: int = 0  # requests that found at least one node
    chunks: int = 0  # chunks served from nodes
    tokens: int = 0  # prompt tokens served from nodes (their prefill saved)
    bytes_read: int = 0
    nodes_stored: int = 0
    bytes_stored: int = 0
    fills: int = 0  # idle-time exact prefills run


def pieces(layout: PromptLayout, store: BlockStore, namespace: str = "") -> list[Piece]:
    """The prompt's chunk pieces (piece 0, the prefix, is not one), each with its sequence address in the
    request's namespace (one namespace never reads another's nodes)."""
    spans = layout.chunk_spans
    ends = [s for s, _ in spans[1:]] + ([layout.suffix_start] if spans else [])
    space = SEQUENCE_NAMESPACE + namespace
    return [Piece(start, end, store.address_for(layout.token_ids[:end], space)) for (start, _), end in zip(spans, ends)]


class SequenceCache:
    def __init__(self, store: BlockStore):
        self.store = store  # the engine's backend with SEQUENCE_CODEC
        self.counters = SequenceCounters()

    def lookup(self, layout: PromptLayout, namespace: str = "") -> Head:
        """The longest run of leading chunk pieces stored (each verified against its token ids)."""
        self.counters.lookups += 1
        head = Head(end=layout.prefix_len)
        for piece in pieces(layout, self.store, namespace):
            kv = self.store.get(piece.address, layout.token_ids[piece.start:piece.end])
            if kv is None:
                break
            head.nodes.append(kv)
            head.chunks, head.end = head.chunks + 1, piece.end
        if head.chunks:
            c = self.counters
            c.hits, c.chunks, c.tokens = c.hits + 1, c.chunks + head.chunks, c.tokens + head.num_tokens
            c.bytes_read += sum(kv.keys.nbytes + kv.values.nbytes for kv in head.nodes)
        return head

    def store_from(self, layout: PromptLayout, cache: KVCache, namespace: str = "", first: int = 0) -> None:
        """Store the nodes of chunk pieces `first`.. from an exact prefill's cache ([L] x [H, >=end, D])."""
        for piece in pieces(layout, self.store, namespace)[first:]:
            keys = torch.stack([kv.keys[:, piece.start:piece.end] for kv in cache.layers])  # [L, H, T, D]
            values = torch.stack([kv.values[:, piece.start:piece.end] for kv in cache.layers])
            node = ChunkKV(keys, values, layout.token_ids[piece.start:piece.end])  # keys at their real positions
            try:
                data = self.store.encode(node)
                if self.store.put_raw(piece.address, data):
                    self.counters.nodes_stored += 1
                    self.counters.bytes_stored += len(data)
            except StoreFullError as exc:
                log.info("sequence node not stored: %s", exc)
                return

    def fill_job(self, runner, layout: PromptLayout, namespace: str = "") -> Iterator[None] | None:
        """An idle-time job computing the prompt's leading pieces in full and storing their nodes; None when
        they are stored already. Two jobs queued for one prompt: the second finds the nodes stored and stops."""
        found = pieces(layout, self.store, namespace)
        if not found or self.store.contains(found[-1].address):
            return None
        return self._fill(runner, layout, namespace, found[-1].address)

    def _fill(self, runner, layout: PromptLayout, namespace: str, last: str) -> Iterator[None]:
        if self.store.contains(last):  # an earlier job stored them while this one waited
            return
        cache = KVCache.empty(runner.shape.num_layers)
        yield from prefill_units(runner, layout.token_ids[:layout.suffix_start], cache, [])
        self.store_from(layout, cache, namespace)
        self.counters.fills += 1
