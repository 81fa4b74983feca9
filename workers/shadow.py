"""Shadow verification: what blending costs on live traffic, measured without labels.

A sampled share of greedy blend requests (`EngineConfig.shadow_sample`, default 0 = off) is run again
as a full prefill after its answer was sent, as an idle-time job (Scheduler.defer: low priority, a
bounded queue, dropped rather than queued when full). The two answers are compared: the first token,
the whole answer (the same number of greedy tokens), and KL(full || blend) of the first token's
distribution. Per namespace, in Stats and in the Prometheus metrics.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

import torch

from workers.adaptive import RatioController
from workers.cache import KVCache
from workers.batching.step import decode_step
from workers.idle import prefill_units

if TYPE_CHECKING:
    from workers.modes import PrefillPlan


@dataclass
class ShadowFigures:
    """One namespace's figures: how often blend's answer was full's."""

    checked: int = 0
    first_token_agree: int = 0
    answer_agree: int = 0
    kl_sum: float = 0.0

    @property
    def first_token_agreement(self) -> float:
        return self.first_token_agree / self.checked if self.checked else 0.0

    @property
    def answer_agreement(self) -> float:
        return self.answer_agree / self.checked if self.checked else 0.0

    def as_dict(self) -> dict:
        mean_kl = self.kl_sum / self.checked if self.checked else 0.0
        return {"checked": self.checked, "first_token_agreement": self.first_token_agreement,
                "answer_agreement": self.answer_agreement, "mean_kl": mean_kl}


@dataclass
class ShadowStats:
    sample: float = 0.0
    sampled: int = 0  # requests picked for a check
    dropped: int = 0  # picked, but the idle-time queue was full
    namespaces: dict[str, ShadowFigures] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"sample": self.sample, "sampled": self.sampled, "dropped": self.dropped,
                "namespaces": {ns: f.as_dict() for ns, f in sorted(self.namespaces.items())}}


@dataclass(frozen=True)
class Blended:
    """What a sampled blend request answered: enough to compare a full prefill's answer with it."""

    namespace: str
    prompt_ids: list[int]
    first_logits: torch.Tensor  # [vocab] fp32, the last prompt token's under blend
    tokens: list[int]  # the greedy answer sent
    stopped: bool  # it ended on a stop token (not at max_new_tokens)
    adaptive_ratio: float | None = None  # the adaptive ratio it ran at (workers/adaptive.py), else None


class ShadowVerifier:
    """`decode_weights`: the engine's decode kernels, so the full answer is what `full` mode would send."""

    def __init__(self, runner, decode_weights, sample: float, seed: int | None = None,
                 adaptive: RatioController | None = None):
        if not 0.0 <= sample <= 1.0:
            raise ValueError(f"shadow_sample must be in [0, 1], got {sample}")
        self.runner, self.decode_weights, self.stats = runner, decode_weights, ShadowStats(sample=sample)
        self.adaptive = adaptive  # steered by the checks of requests that ran at its ratio
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def picks(self, plan: PrefillPlan, temperature: float) -> bool:
        """Whether this request is checked: greedy blend requests that blend (one served by an exact prefill
        would compare full with full), at the sample rate."""
        if self.stats.sample <= 0 or plan.mode != "blend" or plan.blend is None or temperature != 0:
            return False
        with self._lock:
            return self._random.random() < self.stats.sample

    def job(self, blended: Blended) -> Iterator[None]:
        """The idle-time check: a full prefill in units, then full's greedy answer, token by token."""
        runner, out = self.runner, []
        cache = KVCache.empty(runner.shape.num_layers)
        yield from prefill_units(runner, blended.prompt_ids, cache, out)
        full_first = out[0].reshape(-1).float()
        # one token more where blend stopped early: full must stop there too to agree
        limit = len(blended.tokens) + int(blended.stopped)
        tokens, logits, position = [], full_first, len(blended.prompt_ids)
        while len(tokens) < limit:
            token = int(logits.argmax())
            if token in runner.stop_token_ids:
                break
            tokens.append(token)
            if len(tokens) < limit:
                with torch.inference_mode():
                    logits = decode_step(runner, self.decode_weights, [token], [position], [cache], [None])[0]
                position += 1
                yield
        self.record(blended, full_first, tokens)

    def record(self, blended: Blended, full_first: torch.Tensor, full_tokens: list[int]) -> None:
        log_full = torch.log_softmax(full_first, dim=-1)
        log_blend = torch.log_softmax(blended.first_logits.float(), dim=-1)
        kl = float((log_full.exp() * (log_full - log_blend)).sum())
        agreed = full_tokens == blended.tokens
        with self._lock:
            figures = self.stats.namespaces.setdefault(blended.namespace, ShadowFigures())
            figures.checked += 1
            figures.first_token_agree += int(full_first.argmax()) == int(blended.first_logits.argmax())
            figures.answer_agree += agreed
            figures.kl_sum += kl
        if self.adaptive is not None and blended.adaptive_ratio is not None:
            self.adaptive.observe(blended.namespace, blended.adaptive_ratio, agreed)

    def queued(self, accepted: bool) -> None:
        with self._lock:
            self.stats.sampled += 1
            self.stats.dropped += not accepted
