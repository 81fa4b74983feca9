"""Accuracy against TTFT, every blend method in one plot: a quality run joined with a `ragkv bench blend` run.

The quality suite measures answers (`blend:METHOD@RATIO` configs on its held-out prompts); `ragkv bench
blend --settings METHOD@RATIO ...` measures the same settings' time to first token through the engine,
side by side with `full`. Joined by config name, each method is a curve of (TTFT speedup against full,
accuracy), one point per ratio; `full`, `reuse`, `shift` and the engine's default `blend` are single
points. `python -m ragkv.bench.quality tradeoff QUALITY.json BLEND.json --plot PNG` prints the table and
draws the plot.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragkv.bench.quality.report import RATIO_RE, save_figure  # blend@R, blend:METHOD@R

SINGLE = ("full", "reuse", "shift", "blend")  # modes both runs measure under the same name


@dataclass(frozen=True)
class Point:
    config: str  # the quality config / bench row label
    method: str  # the selection method, or the mode for a single point
    ratio: float | None  # recompute ratio; None for a mode
    accuracy: float  # quality suite, mean over families
    agreement: float  # quality suite, same greedy tokens as full
    speedup: float  # bench blend, paired median of full TTFT / this TTFT


def tradeoff_points(quality: dict, ttft: dict) -> list[Point]:
    """Every config both runs measured, sorted by method then ratio.

    quality: a quality-suite result (`overall.accuracy`, `overall.agreement_vs_full`);
    ttft: a `ragkv bench blend` result (`speedup_paired` per mode and setting)."""
    if "speedup_paired" not in ttft:
        raise ValueError("the TTFT file is not a `ragkv bench blend` result (no speedup_paired)")
    if "overall" not in quality:
        raise ValueError("the quality file is not a quality-suite result (no overall)")
    accuracy, agreement = quality["overall"]["accuracy"], quality["overall"]["agreement_vs_full"]
    points = []
    for config, speedup in ttft["speedup_paired"].items():
        if config not in accuracy:
            continue
        match = RATIO_RE.match(config)
        if match is None and config not in SINGLE:
            continue
        method, ratio = (match.group(1) or "blend", float(match.group(2))) if match else (config, None)
        points.append(Point(config, method, ratio, accuracy[config], agreement[config], speedup))
    if not points:
        raise ValueError("no config is in both files: run the same blend:METHOD@RATIO settings in both")
    return sorted(points, key=lambda p: (p.ratio is not None, p.method, p.ratio or 0.0))


def markdown(points: list[Point], split: str) -> str:
    lines = [f"| config | recompute ratio | accuracy ({split}) | agreement with full | TTFT speedup vs full (paired) |",
             "|---|---|---|---|---|"]
    for p in points:
        ratio = "" if p.ratio is None else f"{p.ratio:g}"
        lines.append(f"| {p.config} | {ratio} | {p.accuracy:.3f} | {p.agreement:.3f} | {p.speedup:.2f}x |")
    return "\n".join(lines)


def plot(points: list[Point], path: str, title: str) -> Path:
    """One line per method (its ratios, in order), single markers for the modes; x on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    curves: dict[str, list[Point]] = {}
    for p in points:
        if p.ratio is not None:
            curves.setdefault(p.method, []).append(p)
    markers = "osD^v<>PXh*p"
    for i, (method, curve) in enumerate(curves.items()):
        ax.plot([p.speedup for p in curve], [p.accuracy for p in curve], marker=markers[i % len(markers)],
                linestyle="-", label=method)
        for p in curve:
            ax.annotate(f"{p.ratio:g}", (p.speedup, p.accuracy), fontsize=6, xytext=(3, 2), textcoords="offset points")
    styles = {"full": ("k", "*"), "reuse": ("tab:orange", "X"), "shift": ("tab:red", "P"), "blend": ("tab:blue", "*")}
    for p in points:
        if p.ratio is None:
            color, marker = styles[p.method]
            ax.scatter([p.speedup], [p.accuracy], color=color, marker=marker, s=90, zorder=3,
                       label="blend (default)" if p.method == "blend" else p.method)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT speedup against full prefill (paired median, log scale)")
    ax.set_ylabel("accuracy (mean over families)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, Path(path), dpi=100)
