"""Adaptive blend ratio: hold a target answer agreement on live traffic, within set bounds.

Shadow verification (workers/shadow.py) re-runs a sample of blend requests as full prefills and says
whether each blended answer was full's. With `EngineConfig.adaptive_target` set, those checks steer
the recompute ratio of requests that ask for none, per namespace, along a ladder of allowed ratios
(`adaptive_ratios`, lowest and highest are the bounds):

    after `adaptive_window` checks at the current ratio, agreement a over them:
        a <  target                  -> one rung up   (recompute more)
        a >= (1 + target) / 2        -> one rung down (half-way from the target to perfect: some margin)
        otherwise                    -> stay
    a check of a request that ran at another ratio (its own, or before a change) is not counted

A namespace starts at the rung nearest the ratio its requests would run at without the controller (its
calibration, `ragkv calibrate --requests --namespace`, else the server's), which the engine passes in.
Every change is logged and kept (the last MAX_CHANGES) for Stats and the metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field

log = logging.getLogger("ragkv.adaptive")

MAX_CHANGES = 50


def parse_ratios(text: str) -> tuple[float, ...]:
    """`"0.15,0.3,0.5"` -> (0.15, 0.3, 0.5): ascending, distinct, in [0, 1]; ValueError naming adaptive_ratios."""
    try:
        ratios = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"adaptive_ratios: not a comma-separated list of numbers: {text!r}") from None
    if not ratios or any(not 0.0 <= r <= 1.0 for r in ratios) or list(ratios) != sorted(set(ratios)):
        raise ValueError(f"adaptive_ratios: ratios in [0, 1], ascending and distinct, got {text!r}")
    return ratios


@dataclass(frozen=True)
class RatioChange:
    namespace: str
    old: float
    new: float
    agreement: float  # over the window that decided it
    checks: int
    at: float  # unix time


@dataclass
class _Rung:
    index: int
    checks: int = 0
    agreed: int = 0


@dataclass
class RatioController:
    target: float  # answer agreement to hold, in (0, 1]
    ratios: tuple[float, ...]  # the ladder, ascending; its ends are the bounds
    window: int  # checks per decision
    changes: list[RatioChange] = field(default_factory=list)  # the last MAX_CHANGES
    changed: int = 0  # changes in all
    _rungs: dict[str, _Rung] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not 0.0 < self.target <= 1.0:
            raise ValueError(f"adaptive_target: must be in (0, 1], got {self.target}")
        if self.window < 1:
            raise ValueError(f"adaptive_window: must be >= 1, got {self.window}")

    def ratio(self, namespace: str, start: float) -> float:
        """The ratio a request of `namespace` without its own ratio runs at now. `start`: the namespace's setting
        (its calibration, else the server's); a namespace seen for the first time starts at the nearest rung."""
        with self._lock:
            if namespace not in self._rungs:
                nearest = min(range(len(self.ratios)), key=lambda i: abs(self.ratios[i] - start))
                self._rungs[namespace] = _Rung(nearest)
            return self.ratios[self._rungs[namespace].index]

    def observe(self, namespace: str, ratio: float, agreed: bool) -> RatioChange | None:
        """One shadow check of a request that ran at `ratio`; the change it caused, if any."""
        with self._lock:
            rung = self._rungs.get(namespace)  # set by ratio(), which ran the checked request's plan
            if rung is None or ratio != self.ratios[rung.index]:
                return None
            old = self.ratios[rung.index]
            rung.checks += 1
            rung.agreed += int(agreed)
            if rung.checks < self.window:
                return None
            agreement, checks = rung.agreed / rung.checks, rung.checks
            step = -1 if agreement >= (1 + self.target) / 2 else (1 if agreement < self.target else 0)
            index = min(max(rung.index + step, 0), len(self.ratios) - 1)
            self._rungs[namespace] = _Rung(index)
            if index == rung.index:
                return None
            change = RatioChange(namespace, old, self.ratios[index], agreement, checks, time.time())
            self.changes = (self.changes + [change])[-MAX_CHANGES:]
            self.changed += 1
        log.info("adaptive ratio, namespace %r: %g -> %g (answer agreement %.3f over %d checks, target %g)",
                 namespace, change.old, change.new, agreement, checks, self.target)
        return change

    def as_dict(self) -> dict:
        with self._lock:
            return {"target": self.target, "ratios": list(self.ratios), "window": self.window,
                    "namespaces": {ns: {"ratio": self.ratios[r.index], "checks": r.checks, "agreed": r.agreed}
                                   for ns, r in sorted(self._rungs.items())},
                    "changed": self.changed, "changes": [asdict(c) for c in self.changes]}
