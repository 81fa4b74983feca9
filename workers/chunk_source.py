"""Stored KV for the prefill pipeline: chunk and prefix blocks read from the block store, computed and
stored on a miss. `ChunkLoader` is the engine's, one per process; `StoredChunks` is one request's view
of it (workers/pipeline.py's ChunkSource).

A store fault is a miss: the chunk is computed and the request marked degraded, never failed.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from kvstore.backends.base import StoreFullError
from kvstore.kv import ChunkKV
from kvstore.store import BlockStore
from workers.chunk_forms import compute_chunk
from workers.errors import Cancelled
from workers.eviction.chunks import chunk_namespace, compress_chunk, spec_from_json
from workers.pipeline import Loaded
from workers.prompt import PromptLayout
from workers.requests import CompressionSpec
from workers.sequences import Head, SequenceCache

if TYPE_CHECKING:
    from workers.protocol import ChunkCompute

log = logging.getLogger("ragkv.chunks")

# prefix blocks never collide with chunk blocks of the same tokens. ":alone": a prefix is computed as what it
# is, the start of the prompt; before 2026-12-02 the engine computed it in the chunk form (`lead`: after a
# second copy of the template), and those blocks, wrong KV, must not be found
PREFIX_NAMESPACE = "\x00prefix:alone"
# the prefix is reused as an exact prefix (`prefix` mode = vLLM's prefix cache): stored losslessly
PREFIX_CODEC = "fp32"
PREFIX_FORM = "alone"
PREFIX_MEMO = 16  # system-prompt prefixes kept decoded in memory


class ChunkLoader:
    """Reads chunk and prefix blocks, computing and storing the ones missing (runs on the scheduler's thread).

    `chunk_compute`: where a missing chunk is computed: None = here; a ChunkCompute (the Ray WorkerPool)
    writes the block to the shared store, and the loader reads it back (or computes it here if that fails)."""

    def __init__(self, runner, store: BlockStore, prefix_store: BlockStore, chunk_form: str,
                 chunk_compute: ChunkCompute | None = None, sequences: SequenceCache | None = None):
        self.runner, self.store, self.prefix_store = runner, store, prefix_store
        self.chunk_form, self.chunk_compute = chunk_form, chunk_compute
        self.sequences = sequences  # exact KV of leading chunk runs (workers/sequences.py); None: off
        self._prefixes: OrderedDict[str, ChunkKV] = OrderedDict()

    def load_or_compute(self, store: BlockStore, token_ids: list[int], namespace: str, pin: bool = False,
                        compression: CompressionSpec | None = None, form: str | None = None,
                        probe: bool = True) -> Loaded:
        """`compression`: the chunk is stored compressed to that spec (its namespace must be chunk_namespace's).
        `form`: how a miss is computed (workers/chunk_forms.py); None = the loader's chunk form.
        `probe=False`: the caller has just missed it (get_many); go straight to computing it."""
        address = store.address_for(token_ids, namespace)
        kv = store.get(address, token_ids) if probe else None
        if kv is not None:
            if pin:
                store.pin(address)
            return Loaded(kv, True)
        if self.chunk_compute is not None and store is self.store and compression is None:  # it writes the block
            self.chunk_compute.compute([token_ids], namespace, pin)
            kv = store.get(address, token_ids)
            if kv is not None:
                return Loaded(kv, False)
        kv = compute_chunk(self.runner, token_ids, form or self.chunk_form)
        if compression is not None:
            kv, _ = compress_chunk(self.runner, kv, compression)
        data, kv = store.as_stored(kv)
        try:
            if store.put_raw(address, data) and pin:
                store.pin(address)
        except StoreFullError as exc:  # pinned blocks fill the budget: answer anyway, uncached
            log.warning("chunk %s not stored: %s", address[:16], exc)
        return Loaded(kv, False)

    def prefix(self, layout: PromptLayout) -> Loaded:
        """The system-prompt prefix block: pinned, stored near-lossless, and kept decoded in memory."""
        address = self.prefix_store.address_for(layout.prefix_ids, PREFIX_NAMESPACE)
        if address in self._prefixes:
            self._prefixes.move_to_end(address)
            return Loaded(self._prefixes[address], True)
        loaded = self.load_or_compute(self.prefix_store, layout.prefix_ids, PREFIX_NAMESPACE, pin=True,
                                      form=PREFIX_FORM)  # the prompt's real start: no lead-in before it
        self._prefixes[address] = loaded.kv
        while len(self._prefixes) > PREFIX_MEMO:
            self._prefixes.popitem(last=False)
        return loaded

    def for_request(self, namespace: str, compressions: list[dict | None],
                    should_stop: Callable[[], bool]) -> "StoredChunks":
        return StoredChunks(self, namespace, compressions, should_stop)


@dataclass
class StoredChunks:
    """One request's ChunkSource: its chunks in its namespace, each with the compression it was ingested with."""

    loader: ChunkLoader
    namespace: str
    compressions: list[dict | None]  # per chunk: the spec a chunk given by id was ingested with, else None
    should_stop: Callable[[], bool]
    degraded: bool = False

    def prefix(self, layout: PromptLayout) -> Loaded:
        return self.loader.prefix(layout)

    def head(self, layout: PromptLayout) -> Head:
        """The exact KV stored for the prompt's leading chunks; none over chunks compressed at ingest (the
        request asked for their smaller KV)."""
        sequences = self.loader.sequences
        if sequences is None or any(c is not None for c in self.compressions):
            return Head(end=layout.prefix_len)
        return sequences.lookup(layout, self.namespace)

    def chunks(self, layout: PromptLayout, first: int = 0) -> list[Loaded]:
        """Chunks `first`.. : read in one backend call with their cold blocks decoded together
        (BlockStore.get_many); each miss computed and stored."""
        store = self.loader.store
        faults_before = store.counters.unavailable  # any store fault during this request degrades it
        wanted = list(zip(layout.chunk_spans, self.compressions))[first:]
        token_ids = [layout.token_ids[start:end] for (start, end), _ in wanted]
        namespaces = [chunk_namespace(self.namespace, compression) for _, compression in wanted]
        found = store.get_many([store.address_for(t, n) for t, n in zip(token_ids, namespaces)], token_ids)
        loaded = []
        for ids, namespace, (_, compression), kv in zip(token_ids, namespaces, wanted, found):
            if self.should_stop():
                raise Cancelled("request cancelled")
            loaded.append(Loaded(kv, True) if kv is not None else self.loader.load_or_compute(
                store, ids, namespace, compression=spec_from_json(compression), probe=False))
        self.degraded = store.degraded or store.counters.unavailable > faults_before
        return loaded
