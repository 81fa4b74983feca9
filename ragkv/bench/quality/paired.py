"""Paired comparison of two configurations on the same prompts: which answers one gains and loses.

Every configuration of a quality run answers the same prompts, so a difference of one answer is a
pair of outcomes, not two independent accuracies. A run stores each prompt's outcome per config
(`families[F]["per_prompt"]["correct"|"agree"][CONFIG]`, lists in prompt order), and this module
reads them:

- gained / lost: prompts `config` answers and `base` does not, and the reverse;
- delta: accuracy(config) - accuracy(base), as `overall` weighs it (mean over families);
- ci: a 95% interval for delta, from a stratified bootstrap (prompts resampled within each family,
  fixed seed, so the same result always gives the same interval);
- p: exact two-sided McNemar test, P(a split at least this uneven | gains and losses equally likely).

With 4 prompts a family, one answer is 25 points of its family and ~2 points overall; the interval
says whether a gap is larger than the run can resolve.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

OUTCOMES = ("correct", "agree")  # the per-prompt outcomes a run stores
BOOTSTRAP_SAMPLES = 2000
SEED = 0


@dataclass(frozen=True)
class Paired:
    base: str
    config: str
    metric: str
    prompts: int
    gained: int  # config right, base wrong
    lost: int  # config wrong, base right
    delta: float  # mean over families of accuracy(config) - accuracy(base)
    ci: tuple[float, float]  # 95% stratified bootstrap interval of delta
    p: float  # exact two-sided McNemar

    def within(self, margin: float) -> bool:
        """Non-inferiority: the whole interval lies above -margin."""
        return self.ci[0] >= -margin


def per_prompt(rows: list[dict], names: list[str]) -> dict[str, dict[str, list[int]]]:
    """{outcome: {config: [0|1 per prompt]}} from one family's outcome rows (evaluate_prompt's dicts)."""
    return {"correct": {n: [int(r[n].correct) for r in rows] for n in names},
            "agree": {n: [int(r[n].agree) for r in rows] for n in names}}


def pairs(result: dict, base: str, config: str, metric: str = "correct") -> dict[str, list[tuple[int, int]]]:
    """{family: [(base outcome, config outcome) per prompt]}; a clear error for runs without outcomes."""
    if metric not in OUTCOMES:
        raise ValueError(f"unknown metric {metric!r}; expected one of {OUTCOMES}")
    for name in (base, config):
        if name not in result["configs"]:
            raise ValueError(f"config {name!r} is not in this run; it has {result['configs']}")
    out = {}
    for family, data in result["families"].items():
        if "per_prompt" not in data:
            raise ValueError(f"family {family!r} has no per-prompt outcomes (a run older than paired.py)")
        table = data["per_prompt"][metric]
        out[family] = list(zip(table[base], table[config]))
    return out


def compare(result: dict, base: str, config: str, metric: str = "correct") -> Paired:
    by_family = pairs(result, base, config, metric)
    flat = [pair for rows in by_family.values() for pair in rows]
    gained, lost = gains_and_losses(flat)
    return Paired(base, config, metric, len(flat), gained, lost, _delta(by_family.values()),
                  bootstrap_ci(by_family), mcnemar_p(gained, lost))


def _delta(families) -> float:
    return statistics.fmean(statistics.fmean(c - b for b, c in rows) for rows in families)


def bootstrap_ci(by_family: dict[str, list[tuple[int, int]]], samples: int = BOOTSTRAP_SAMPLES,
                 seed: int = SEED) -> tuple[float, float]:
    """95% percentile interval of the mean-over-families difference, prompts resampled per family."""
    rng = random.Random(seed)
    diffs = [[c - b for b, c in rows] for rows in by_family.values()]
    stats = sorted(statistics.fmean(statistics.fmean(rng.choices(d, k=len(d))) for d in diffs)
                   for _ in range(samples))
    return stats[int(0.025 * samples)], stats[int(0.975 * samples) - 1]


def mcnemar_p(gained: int, lost: int) -> float:
    """Exact two-sided McNemar: binomial(gained + lost, 1/2) tail at the smaller count, doubled, capped at 1."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def gains_and_losses(rows: list[tuple[int, int]]) -> tuple[int, int]:
    """(config right and base wrong, base right and config wrong) over (base, config) pairs."""
    return sum(1 for b, c in rows if c and not b), sum(1 for b, c in rows if b and not c)


def family_changes(result: dict, base: str, config: str, metric: str = "correct") -> dict[str, tuple[int, int]]:
    """{family: (gained, lost)}: where a change helps one family and hurts another."""
    return {family: gains_and_losses(rows) for family, rows in pairs(result, base, config, metric).items()}


def has_outcomes(result: dict) -> bool:
    return all("per_prompt" in data for data in result["families"].values())


def table(result: dict, base: str = "full", metric: str = "correct") -> list[str]:
    """Markdown rows: every other config against `base`."""
    lines = [f"| config vs `{base}` | prompts | gained | lost | Δ {_label(metric)} [95% CI] | McNemar p |",
             "|---|---|---|---|---|---|"]
    for name in result["configs"]:
        if name == base:
            continue
        c = compare(result, base, name, metric)
        lines.append(f"| {name} | {c.prompts} | {c.gained} | {c.lost} | {c.delta:+.3f} "
                     f"[{c.ci[0]:+.3f}, {c.ci[1]:+.3f}] | {c.p:.3g} |")
    return lines


def _label(metric: str) -> str:
    return {"correct": "accuracy", "agree": "agreement"}[metric]
