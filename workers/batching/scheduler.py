"""Continuous batching: a waiting queue, a running batch and one step loop (nano-vllm's shape).

    step():  admit (prefill one waiting request, if the batch has room)
             decode (every running request's next token in one batched forward)

New requests join between steps; a finished, cancelled or failed request leaves at the next one.
Waiting is first come, first served, and every step decodes every running request, so no request
starves: a prefill delays the batch by one prefill, and a request waits for at most the ones ahead.
All model work runs on the one thread that drives the loop: ingest's chunk compute comes in through
`call()` and runs between two steps, so no lock is needed. The scheduler knows nothing of modes or
stores: `prefill(seq)` (the engine's) fills the sequence's cache and first logits, `decode(seqs)`
advances them all by one token.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Iterator

from workers.batching.linear import DEFAULT_DECODE_KERNEL
from workers.batching.sequence import Sequence
from workers.errors import Cancelled, ResourceExhausted
from workers.openmp import release_pool
from workers.stats import BatchStats

log = logging.getLogger("ragkv.scheduler")

IDLE_WAIT_S = 0.05


@dataclass(frozen=True)
class BatchConfig:
    max_batch: int = 8  # requests decoded together; 1 = one request at a time
    max_batch_tokens: int | None = None  # KV tokens (prompt + max_new_tokens) the running batch may hold
    max_waiting: int = 64  # admitted requests waiting for a place in the batch; more is RESOURCE_EXHAUSTED
    decode_kernel: str = DEFAULT_DECODE_KERNEL  # workers/batching/linear.py: DECODE_KERNELS
    # idle-time jobs (exact sequence prefills, shadow verification) waiting; more are dropped, never queued
    max_background: int = 16

    def __post_init__(self) -> None:
        from workers.batching.linear import DECODE_KERNELS

        if self.max_batch < 1:
            raise ValueError(f"--max-batch: must be >= 1, got {self.max_batch}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ValueError(f"--max-batch-tokens: must be >= 1, got {self.max_batch_tokens}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting: must be >= 0, got {self.max_waiting}")
        if self.decode_kernel not in DECODE_KERNELS:
            raise ValueError(f"--decode-kernel: unknown kernel {self.decode_kernel!r}; expected one of "
                             f"{', '.join(DECODE_KERNELS)}")


class Scheduler:
    def __init__(self, config: BatchConfig, prefill: Callable[[Sequence], None],
                 decode: Callable[[list[Sequence]], None]):
        self.config = config
        self.prefill = prefill
        self.decode = decode
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = BatchStats()
        self._wake = threading.Condition()
        self._closed = False
        self._driver: str | None = None  # "thread" (started at the first submit) or "caller" (run())
        self._thread: threading.Thread | None = None
        self._driver_thread: threading.Thread | None = None  # the one thread that runs model work
        self.tasks: deque[tuple[Callable[[], object], Future]] = deque()  # call(): work between steps
        self._collected_at = 0  # stats.steps at the last idle garbage collection
        self._worked = False  # model work ran since this thread last handed its OpenMP workers back
        # defer(): idle-time jobs, each a generator run one step at a time while no request waits or runs
        self.background: deque[Iterator[None]] = deque()

    # -- callers --------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        with self._wake:
            if self._closed:
                raise Cancelled("the engine is shutting down")
            if len(self.waiting) >= self.config.max_waiting + max(0, self.config.max_batch - len(self.running)):
                raise ResourceExhausted(f"scheduler queue is full ({len(self.waiting)} waiting); retry later")
            seq.arrived = time.perf_counter()
            self.waiting.append(seq)
            self._ensure_driver()
            self._wake.notify()

    def call(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the scheduler's thread between two steps and return its result (or raise its error).

        All model work runs on that one thread (ingest's chunk compute too): torch's OpenMP pool
        throttles its spin-waiting once a second thread owns a team of its own, and a decode step
        then takes twice as long (measured: docs/benchmarks.md "Serving performance")."""
        if threading.current_thread() is self._driver_thread:
            return fn()
        done = Future()
        with self._wake:
            if self._closed:
                raise Cancelled("the engine is shutting down")
            self.tasks.append((fn, done))
            self._ensure_driver()
            self._wake.notify()
        return done.result()

    def defer(self, job: Iterator[None]) -> bool:
        """Queue an idle-time job (a generator: each `next` is one short unit of model work, e.g. a few
        layers); it runs only while no request waits or runs, so it never delays one by more than a unit.
        False (and dropped) when `max_background` jobs wait already: the queue never grows past it."""
        with self._wake:
            if self._closed or len(self.background) >= self.config.max_background:
                self.stats.background_dropped += 1
                return False
            self.background.append(job)
            self._ensure_driver()
            self._wake.notify()
        return True

    def wait_idle(self, timeout_s: float) -> float:
        """Wait until no idle-time job is left, at most `timeout_s` -> the seconds waited (a job leaves the
        queue when it has finished)."""
        start = time.monotonic()
        while self.background and time.monotonic() - start < timeout_s:
            time.sleep(0.01)
        return time.monotonic() - start

    def _ensure_driver(self) -> None:
        """Under _wake: nobody drives the loop yet, so a thread of its own does."""
        if self._driver is None:
            self._driver = "thread"
            self._thread = threading.Thread(target=self._loop, name="ragkv-scheduler", daemon=True)
            self._driver_thread = self._thread
            self._thread.start()

    def claim(self) -> bool:
        """Make the calling thread the one that will drive the loop (run()); False if a thread already does."""
        with self._wake:
            if self._driver is None:
                self._driver, self._driver_thread = "caller", threading.current_thread()
            return self._driver_thread is threading.current_thread()

    def run(self, until: threading.Event) -> None:
        """Drive the loop on the calling thread until `until` is set and the batch is empty.

        `ragkv serve` claims the process's main thread before it listens and runs the loop there. That was
        once measured as twice as fast as a second thread; the cause was a second OpenMP pool (workers/openmp.py),
        and with one pool a decode step takes the same time on either (9.8-11.6 against 11.1-11.3 ms a step,
        research/results/2026-12-07-ninth/decode_thread.py)."""
        if not self.claim():  # a thread of its own already drives it
            while not until.wait(IDLE_WAIT_S):
                pass
            return
        self._loop(until)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop taking requests, finish the running ones (bounded by `timeout_s`), cancel the rest."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the loop ---------------------------------------------------------------------
    def _loop(self, until: threading.Event | None = None) -> None:
        while True:
            if not (self.waiting or self.running or self.tasks) and self.stats.steps != self._collected_at:
                # idle after work: collect the cycles a burst of requests left, off the hot path (with
                # them around, Python's collector ran during decode steps and slowed them by ~15%)
                gc.collect()
                self._collected_at = self.stats.steps
            if self._worked and not (self.waiting or self.running or self.tasks or self.background):
                # nothing left to do: this thread's OpenMP workers go, so that another thread's model work (a
                # second engine, the caller's) runs with the process's only pool (workers/openmp.py)
                release_pool()
                self._worked = False
            with self._wake:
                while not (self.waiting or self.running or self.tasks or self.background or self._closed
                           or (until and until.is_set())):
                    self._wake.wait(IDLE_WAIT_S)
                if (self._closed or (until is not None and until.is_set())) and not self.running and not self.tasks:
                    if self._closed:
                        for seq in self.waiting:
                            seq.finish(Cancelled("the engine is shutting down"))
                        self.waiting.clear()
                    if self._closed or not self.waiting:
                        return
            if not (self.waiting or self.running or self.tasks):
                self._run_background()
                continue
            try:
                self.step()
            except Exception as exc:  # a bug in a step must not leave callers waiting forever
                log.exception("scheduler step failed; failing the %d running requests", len(self.running))
                for seq in self.running:
                    seq.finish(exc)
                self.running = []

    def step(self) -> None:
        """Run the queued calls, admit at most one waiting request (its prefill), then decode every
        running request one token."""
        self.stats.steps += 1
        self._worked = True
        self._run_tasks()
        seq = self._admit()
        if seq is not None:
            self._run_prefill(seq)
        self._retire()
        if self.running:
            self._run_decode()
        self.stats.waiting, self.stats.running = len(self.waiting), len(self.running)

    def _run_background(self) -> None:
        """One unit of the oldest idle-time job; a finished or failed job leaves the queue."""
        with self._wake:
            if not self.background:
                return
            job = self.background[0]
        self._worked = True
        try:
            next(job)
            return
        except StopIteration:
            self.stats.background_done += 1
        except Exception:  # an idle-time job's failure is logged, never a request's
            log.exception("background job failed")
            self.stats.background_failed += 1
        with self._wake:
            self.background.popleft()

    def _run_tasks(self) -> None:
        while True:
            with self._wake:
                if not self.tasks:
                    return
                fn, done = self.tasks.popleft()
            try:
                done.set_result(fn())
            except BaseException as exc:  # the caller's error, raised in the caller's thread
                done.set_exception(exc)

    def _admit(self) -> Sequence | None:
        with self._wake:
            while self.waiting and self.waiting[0].stopped():  # cancelled while waiting: never computed
                self.waiting.popleft().finish(Cancelled("request cancelled while queued"))
            if self._closed or not self.waiting or len(self.running) >= self.config.max_batch:
                return None
            budget = self.config.max_batch_tokens
            held = sum(s.kv_tokens for s in self.running)
            head = self.waiting[0]
            if budget is not None and self.running and held + head.kv_tokens > budget:
                return None  # waits for room; an empty batch takes any request, so none waits forever
            return self.waiting.popleft()

    def _run_prefill(self, seq: Sequence) -> None:
        try:
            self.prefill(seq)
        except BaseException as exc:  # the request's own error (NotFound, InvalidArgument, ...) goes to its caller
            seq.finish(exc if isinstance(exc, Exception) else Cancelled(str(exc)))
            return
        self.stats.prefills += 1
        seq.started()
        self.running.append(seq)
        for job in seq.background:  # work the prefill asked for, done while nothing else waits
            self.defer(job)
        seq.background = []

    def _retire(self) -> None:
        """Sample each running request's next token; the ones that end (stop token, length, cancel) leave."""
        keep = []
        for seq in self.running:
            if seq.stopped():
                seq.finish(Cancelled("request cancelled"))
                continue
            token = seq.next_token()
            if token in seq.stop_ids:
                seq.finish()
                continue
            seq.emit(token)
            if len(seq.tokens) >= seq.params.max_new_tokens:
                seq.finish()
                continue
            keep.append(seq)
        self.running = keep

    def _run_decode(self) -> None:
        start = time.perf_counter()
        batch = list(self.running)
        try:
            self.decode(batch)
        except Exception as exc:  # a failed step fails its batch, not the server
            log.exception("decode step failed for %d requests", len(batch))
            for seq in batch:
                seq.finish(exc)
            self.running = []
            return
        self.stats.decode_steps += 1
        self.stats.tokens += len(batch)
        self.stats.batch_size = len(batch)
        self.stats.step_s = time.perf_counter() - start
