"""Sequence: one request's state while the scheduler serves it, and the events it hands its caller.

The scheduler thread writes (prefill result, tokens, the end); the caller's thread reads `events()`.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from workers.cache import KVCache
from workers.generate import DecodeHooks, SamplingParams, sample_token

if TYPE_CHECKING:
    from workers.request_state import RequestState

POLL_S = 0.05  # how often a waiting caller looks at its own cancellation


@dataclass
class Sequence:
    request: object  # workers.requests.GenerateRequest
    params: SamplingParams
    should_stop: Callable[[], bool] = lambda: False
    arrived: float = 0.0  # perf_counter() at submit
    state: RequestState | None = None  # the engine's typed per-request state (layout, plan, stats)
    # set by the prefill (workers/steps.py)
    cache: KVCache | None = None
    logits: torch.Tensor | None = None  # [vocab]: the distribution of the next token
    next_position: int = 0  # position of the first generated token (the prompt's length)
    hooks: DecodeHooks = field(default_factory=DecodeHooks)
    stop_ids: frozenset[int] | set[int] = frozenset()  # token ids that end the answer
    background: list = field(default_factory=list)  # idle-time jobs the prefill asks for (Scheduler.defer)
    kv_tokens: int = 0  # tokens this request may hold in KV (prompt + max_new_tokens): admission counts it
    # written by the scheduler
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    _events: queue.Queue = field(default_factory=queue.Queue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self._generator = torch.Generator().manual_seed(self.params.seed)

    # -- scheduler side -------------------------------------------------------
    def next_token(self) -> int:
        """Sample from `logits` (the request's own generator: a seed gives the same tokens in any batch)."""
        return sample_token(self.logits.reshape(-1), self.params, self._generator)

    def stopped(self) -> bool:
        return self._cancelled.is_set() or self.should_stop()

    def emit(self, token: int) -> None:
        self.tokens.append(token)
        self._events.put(("token", token))

    def started(self) -> None:
        self._events.put(("started", None))

    def finish(self, error: BaseException | None = None) -> None:
        if not self.done:
            self.done = True
            self._events.put(("error", error) if error is not None else ("done", None))

    # -- caller side ------------------------------------------------------------
    def cancel(self) -> None:
        """The caller went away: the scheduler drops the request at its next step."""
        self._cancelled.set()

    def events(self) -> Iterator[tuple[str, object]]:
        """("started", None), ("token", id)..., then ("done", None); an error is raised here.
        While waiting, a caller whose should_stop() turns true cancels the request."""
        while True:
            try:
                kind, value = self._events.get(timeout=POLL_S)
            except queue.Empty:
                if self.should_stop():
                    self.cancel()
                continue
            if kind == "error":
                raise value
            yield kind, value
            if kind == "done":
                return
