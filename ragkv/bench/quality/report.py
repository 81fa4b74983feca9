"""Readable output of a quality run: a Markdown table per family and PNG plots (matplotlib, Agg)."""

from __future__ import annotations

import re
from pathlib import Path

from ragkv.bench.quality.paired import family_changes, has_outcomes, table

RATIO_RE = re.compile(r"^blend(?::([a-z-]+))?@([0-9.]+)$")  # blend@R, blend:METHOD@R (one line per method)
POLICY_RE = re.compile(r"^policy:([a-z0-9_]+)@([0-9.]+)$")
INGEST_RE = re.compile(r"^ingest:([a-z0-9_-]+)@([0-9.]+)$")  # chunks compressed at ingest, then blended
CODEC_RE = re.compile(r"^codec:([a-z0-9_]+)$")


def markdown(result: dict) -> str:
    lines = [f"# Quality suite, split `{result['split']}` (codec for blend/reuse: {result['codec']})", ""]
    sections = {"overall (mean over families)": {"n": result["prompts"], **result["overall"]}}
    sections.update(result["families"])
    paired = has_outcomes(result)  # runs before per-prompt outcomes have no paired columns
    # {config: {family: (gained, lost)}} against full, computed once for every family's table
    by_config = {name: family_changes(result, "full", name) for name in result["configs"]} if paired else {}
    for family, data in sections.items():
        head = f"## {family}"
        if "prompt_tokens" in data:
            head += f" — {data['n']} prompts, ~{data['prompt_tokens']} tokens"
        changes = {name: per_family[family] for name, per_family in by_config.items() if family in per_family}
        lines += [head, "", "| config | accuracy | agreement with full | KL vs full | KV bytes vs full "
                  "| answers gained / lost vs full |", "|---|---|---|---|---|---|"]
        kv_bytes = data.get("kv_bytes_vs_full", {})  # runs before the column have none
        for name in result["configs"]:
            cache = f"{kv_bytes[name]:.2f}" if name in kv_bytes else ""
            change = "+{} / -{}".format(*changes[name]) if name in changes else ""
            lines.append(f"| {name} | {data['accuracy'][name]:.2f} | {data['agreement_vs_full'][name]:.2f} "
                         f"| {data['kl_vs_full'][name]:.3f} | {cache} | {change} |")
        lines.append("")
        if paired and family.startswith("overall"):
            lines += ["Paired against full on the same prompts (`ragkv/bench/quality/paired.py`):", "",
                      *table(result, "full"), ""]
            if "reuse" in result["configs"]:
                lines += [*table(result, "reuse"), ""]
    return "\n".join(lines)


def codec_bytes_per_token(name: str) -> float:
    """Stored payload bytes per token for the default model's shape (30 layers, 3 kv heads, head_dim 64)."""
    from kvstore.codecs import make_codec

    tokens = 256
    return make_codec(name).payload_size((30, 3, tokens, 64)) / tokens


def write_plots(result: dict, directory: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = [p for p in (_ratio_plot(result, out), _codec_plot(result, out), _budget_plot(result, out)) if p]
    return [str(p) for p in written]


def save_figure(fig, path: Path, dpi: int = 90) -> Path:
    """Lay out, write and close `fig` (its folder made if missing)."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _series(result: dict, pattern: re.Pattern) -> list[tuple[tuple, str]]:
    return [(m.groups(), name) for name in result["configs"] if (m := pattern.match(name))]


def _ratio_plot(result: dict, out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    lines: dict[str, list[tuple[float, str]]] = {}  # method ("blend": the engine's setting) -> [(ratio, config)]
    for (method, ratio), name in _series(result, RATIO_RE):
        lines.setdefault(method or "blend", []).append((float(ratio), name))
    if not lines:
        return None
    lines = {method: sorted(points) for method, points in sorted(lines.items())}
    groups = {"mean": result["overall"], **result["families"]}
    cols = 4
    rows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, (family, data) in zip(axes.flat, groups.items()):
        acc = data["accuracy"]
        for method, points in lines.items():
            ax.plot([r for r, _ in points], [acc[n] for _, n in points], "o-", label=method)
        if "reuse" in acc:
            ax.axhline(acc["reuse"], color="tab:orange", linestyle="--", label="reuse")
        ax.axhline(acc["full"], color="tab:green", linestyle=":", label="full")
        ax.set_title(family, fontsize=9)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("recompute ratio", fontsize=8)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"accuracy vs recompute ratio ({result['split']}, codec {result['codec']})")
    return save_figure(fig, out / "accuracy_vs_ratio.png")


def _codec_plot(result: dict, out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    codecs = [g[0] for g, _ in _series(result, CODEC_RE)]
    if not codecs:
        return None
    acc = result["overall"]["accuracy"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for codec in codecs:
        x = codec_bytes_per_token(codec)
        ax.scatter([x], [acc[f"codec:{codec}"]], color="tab:blue")
        ax.annotate(codec, (x, acc[f"codec:{codec}"]), fontsize=8)
        if f"blend+codec:{codec}" in acc:
            ax.scatter([x], [acc[f"blend+codec:{codec}"]], color="tab:red", marker="x")
    ax.axhline(acc["full"], color="tab:green", linestyle=":", label="full")
    ax.set_xscale("log")
    ax.set_xlabel("stored bytes per token")
    ax.set_ylabel("accuracy (mean over families)")
    ax.set_title(f"codecs: codec-only (o) and under blend (x), {result['split']}")
    ax.legend(fontsize=8)
    return save_figure(fig, out / "accuracy_vs_bytes.png")


def _budget_plot(result: dict, out: Path) -> Path | None:
    """Accuracy against the kept share: request-time policies (`policy:P@B`, the prompt) and chunks
    compressed at ingest (`ingest:P@B`, each chunk, then blended), one line each; blend over whole chunks
    as a reference line when the run has it."""
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, str]]] = {}
    for prefix, pattern in (("", POLICY_RE), ("ingest ", INGEST_RE)):
        for (policy, budget), name in _series(result, pattern):
            series.setdefault(prefix + policy, []).append((float(budget), name))
    if not series:
        return None
    acc = result["overall"]["accuracy"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in sorted(series.items()):
        points.sort()
        ax.plot([b for b, _ in points], [acc[n] for _, n in points], "o-", label=label)
    ax.axhline(acc["full"], color="black", linestyle=":", label="full")
    if "blend" in acc and any(label.startswith("ingest ") for label in series):
        ax.axhline(acc["blend"], color="tab:gray", linestyle="--", label="blend, whole chunks")
    ax.set_xlabel("budget (fraction of prompt or chunk tokens kept)")
    ax.set_ylabel("accuracy (mean over families)")
    ax.set_title(f"eviction (protected) and chunks compressed at ingest, {result['split']}")
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, out / "accuracy_vs_budget.png")
