"""Paired comparison of quality-suite configs (ragkv/bench/quality/paired.py): pure, no model."""

from __future__ import annotations

import json
import math

import pytest

from ragkv.bench.quality.__main__ import main as quality_main
from ragkv.bench.quality.paired import bootstrap_ci, compare, family_changes, mcnemar_p, table


def run_with(outcomes: dict[str, dict[str, list[int]]]) -> dict:
    """A quality result whose families hold these per-prompt `correct` outcomes (agree = correct)."""
    configs = list(next(iter(outcomes.values())))
    families = {}
    for family, table_ in outcomes.items():
        families[family] = {"n": len(table_["full"]), "per_prompt": {"correct": table_, "agree": table_},
                            "accuracy": {n: sum(v) / len(v) for n, v in table_.items()}}
    return {"configs": configs, "families": families}


def test_mcnemar_is_the_exact_binomial_tail():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(0, 6) == pytest.approx(2 / 2 ** 6)  # 6 losses, no gain: p = 0.031
    assert mcnemar_p(1, 5) == pytest.approx(2 * (1 + 6) / 2 ** 6)
    assert mcnemar_p(5, 1) == mcnemar_p(1, 5)


def test_gains_losses_and_delta_are_counted_per_prompt():
    result = run_with({"a": {"full": [1, 1, 0, 1], "x": [1, 0, 1, 0]},
                       "b": {"full": [1, 1, 1, 1], "x": [1, 1, 1, 1]}})
    c = compare(result, "full", "x")
    assert (c.prompts, c.gained, c.lost) == (8, 1, 2)
    assert c.delta == pytest.approx((0.5 - 0.75 + 0) / 2)  # mean over families, as `overall`
    assert c.ci[0] <= c.delta <= c.ci[1]
    assert family_changes(result, "full", "x") == {"a": (1, 2), "b": (0, 0)}
    assert compare(result, "full", "x") == c  # a fixed seed: the same interval every time


def test_the_interval_resolves_a_real_gap_and_not_noise():
    same = {f"f{i}": {"full": [1, 0, 1, 1], "x": [1, 0, 1, 1]} for i in range(12)}
    assert compare(run_with(same), "full", "x").ci == (0.0, 0.0)
    worse = {f"f{i}": {"full": [1, 1, 1, 1], "x": [0, 0, 1, 1]} for i in range(12)}
    c = compare(run_with(worse), "full", "x")
    assert c.ci[1] < 0 and not c.within(0.02) and c.p < 1e-6
    one = {f"f{i}": {"full": [1, 1, 1, 1], "x": [0 if i == 0 else 1, 1, 1, 1]} for i in range(12)}
    c = compare(run_with(one), "full", "x")  # one answer of 48: the run cannot tell it from nothing
    assert c.lost == 1 and c.ci[0] < c.delta < 0 <= c.ci[1] and c.p == 1.0


def test_bootstrap_stays_inside_each_family():
    ci = bootstrap_ci({"a": [(1, 0)] * 4, "b": [(0, 0)] * 4})
    assert ci == (-0.5, -0.5)  # every resample of `a` loses all, of `b` nothing


def test_unknown_config_metric_or_old_run_is_a_clear_error():
    result = run_with({"a": {"full": [1], "x": [0]}})
    with pytest.raises(ValueError, match="'y' is not in this run"):
        compare(result, "full", "y")
    with pytest.raises(ValueError, match="unknown metric"):
        compare(result, "full", "x", "kl")
    del result["families"]["a"]["per_prompt"]
    with pytest.raises(ValueError, match="no per-prompt outcomes"):
        compare(result, "full", "x")


def test_compare_command_prints_the_table_and_rejects_bad_input(tmp_path, capsys):
    result = run_with({"a": {"full": [1, 1, 0], "x": [0, 1, 1], "reuse": [0, 0, 0]}})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert quality_main(["compare", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "\n".join(table(result, "full"))
    assert "| x | 3 | 1 | 1 |" in out and "| reuse | 3 | 0 | 2 |" in out
    with pytest.raises(SystemExit) as error:
        quality_main(["compare", str(path), "--base", "nope"])
    assert error.value.code == 2 and "'nope' is not in this run" in capsys.readouterr().err
    assert not math.isnan(compare(result, "full", "x").p)
    (tmp_path / "bad.json").write_text("{not json")
    for bad in (tmp_path / "missing.json", tmp_path / "bad.json"):
        with pytest.raises(SystemExit) as error:
            quality_main(["compare", str(bad)])
        assert error.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def plotted_lines(names: list[str], monkeypatch, tmp_path) -> tuple[list[str], list[tuple[str, list[float]]]]:
    """write_plots over a run of these configs (accuracy 0.5 each) -> (PNG file names, sorted (label, xs) drawn)."""
    import matplotlib.axes

    from ragkv.bench.quality.report import write_plots

    result = {"configs": names, "split": "dev", "codec": "wk4v3", "families": {},
              "overall": {"accuracy": {name: 0.5 for name in names}}}
    drawn = []
    original = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda ax, xs, ys, *a, **k: drawn.append((k.get("label"), list(xs))) or original(ax, xs, ys, *a, **k))
    paths = write_plots(result, str(tmp_path))
    return [p.split("/")[-1] for p in paths], sorted(drawn)


def test_ratio_plot_draws_one_line_per_blend_method(tmp_path, monkeypatch):
    """`blend@R` (the engine's setting) and `blend:METHOD@R` configs each get their own accuracy-vs-ratio line."""
    names = ["full", "reuse", "blend@0.15", "blend:gradual@0.15", "blend:gradual@0.5", "blend:legolink@0.15"]
    files, drawn = plotted_lines(names, monkeypatch, tmp_path)
    assert files == ["accuracy_vs_ratio.png"]
    assert drawn == [("blend", [0.15]), ("gradual", [0.15, 0.5]), ("legolink", [0.15])]


def test_budget_plot_draws_policies_and_chunks_compressed_at_ingest(tmp_path, monkeypatch):
    """`policy:P@B` and `ingest:P@B` configs each get an accuracy-vs-budget line, in budget order."""
    names = ["full", "blend", "policy:kvzip@0.5", "policy:kvzip@0.2", "ingest:kvzip@0.3", "ingest:kvzip@0.2",
             "policy:tova@0.2:noprot"]
    files, drawn = plotted_lines(names, monkeypatch, tmp_path)
    assert files == ["accuracy_vs_budget.png"]
    assert drawn == [("ingest kvzip", [0.2, 0.3]), ("kvzip", [0.2, 0.5])]  # :noprot is not a curve


def test_tradeoff_joins_accuracy_and_ttft_by_config_and_draws_every_method(tmp_path, capsys):
    """`tradeoff`: a quality run and a `bench blend` run joined by name; one curve per method, in ratio order."""
    from ragkv.bench.quality.tradeoff import tradeoff_points

    accuracy = {"full": 0.7, "reuse": 0.4, "shift": 0.55, "blend": 0.63, "blend:gradual@0.3": 0.68,
                "blend:gradual@0.15": 0.63, "blend:legolink@0.15": 0.5, "blend:attention@0.15": 0.45}
    quality = {"split": "test", "prompts": 8, "codec": "wk4v3", "configs": list(accuracy),
               "overall": {"accuracy": accuracy, "agreement_vs_full": {k: v / 2 for k, v in accuracy.items()}}}
    speedups = {"full": 1.0, "prefix": 1.0, "reuse": 8.0, "shift": 7.5, "blend": 2.5, "blend:gradual@0.15": 2.4,
                "blend:gradual@0.3": 1.7, "blend:legolink@0.15": 3.0}  # attention@0.15 was not timed
    ttft = {"speedup_paired": speedups, "chunks": 8, "prompt_tokens": 2118}
    points = tradeoff_points(quality, ttft)
    assert [p.config for p in points] == ["blend", "full", "reuse", "shift", "blend:gradual@0.15",
                                          "blend:gradual@0.3", "blend:legolink@0.15"]
    gradual = [p for p in points if p.method == "gradual"]
    assert [(p.ratio, p.accuracy, p.agreement, p.speedup) for p in gradual] == [(0.15, 0.63, 0.315, 2.4),
                                                                               (0.3, 0.68, 0.34, 1.7)]
    (tmp_path / "q.json").write_text(json.dumps(quality))
    (tmp_path / "t.json").write_text(json.dumps(ttft))
    png = tmp_path / "plots" / "tradeoff.png"
    assert quality_main(["tradeoff", str(tmp_path / "q.json"), str(tmp_path / "t.json"), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| blend:gradual@0.3 | 0.3 | 0.680 | 0.340 | 1.70x |" in out and "attention" not in out
    assert png.stat().st_size > 0
    with pytest.raises(ValueError, match="no config is in both"):
        tradeoff_points(quality, {"speedup_paired": {"prefix": 1.0}})
    for bad in ({}, quality):  # a quality file given where the bench file goes, or nothing at all
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(SystemExit) as error:
            quality_main(["tradeoff", str(tmp_path / "q.json"), str(tmp_path / "bad.json")])
        assert error.value.code == 2 and "not a `ragkv bench blend` result" in capsys.readouterr().err
