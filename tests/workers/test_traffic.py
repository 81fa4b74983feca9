"""Calibration on the user's own traffic (workers/traffic.py, `ragkv calibrate --requests`)."""

from __future__ import annotations

import json

import pytest

from workers import calibration
from workers.blend import BlendConfig
from workers.errors import InvalidArgument
from workers.traffic import calibrate_traffic, read_requests

REQUESTS = [
    {"question": "What did the keeper count?",
     "chunks": ["The keeper of Marrow Point counted ships each evening.", "Copper kettles were hammered by hand."]},
    {"question": "Who runs Brightwell?", "system_prompt": "Answer briefly.", "max_new_tokens": 6,
     "chunks": ["Zorblat has two moons, Tiv and Rel.", "Brightwell Robotics is run by Lorna Featherstone."]},
]


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) if isinstance(r, dict) else r for r in rows) + "\n")
    return path


def test_requests_file_is_read_and_a_bad_line_is_named(tmp_path):
    requests = read_requests(_write(tmp_path / "ok.jsonl", REQUESTS))
    assert [r.question for r in requests] == [r["question"] for r in REQUESTS]
    assert requests[1].system_prompt == "Answer briefly." and requests[1].max_new_tokens == 6
    with pytest.raises(InvalidArgument, match="line 2"):
        read_requests(_write(tmp_path / "bad.jsonl", [REQUESTS[0], "{not json"]))
    with pytest.raises(InvalidArgument, match="line 1"):
        read_requests(_write(tmp_path / "empty.jsonl", [{"question": "q", "chunks": []}]))


def test_a_stored_traffic_calibration_changes_the_namespaces_default_ratio(runner, tmp_path, monkeypatch):
    from workers.engine import Engine, EngineConfig
    from workers.requests import GenerateRequest

    path = tmp_path / "calibration-tenant.json"
    requests = read_requests(_write(tmp_path / "r.jsonl", REQUESTS))
    # ratio 1 is full prefill up to rounding: at least one of the two answers agrees at any CPU's kernels
    record = calibrate_traffic(runner, requests, "fp16", ratios=(0.05, 1.0), target=0.5, namespace="tenant",
                               path=path)
    curve = record["agreement_curve"]
    assert set(curve) == {"0.05", "1"} and curve["1"] >= 0.5 and record["target_met"]
    chosen = record["chosen"]["recompute_ratio"]
    assert chosen == (0.05 if curve["0.05"] >= 0.5 else 1.0)  # the smallest ratio that meets the target

    monkeypatch.setattr(calibration, "calibration_path",  # the server-wide record is absent here
                        lambda runner, codec, namespace="": path if namespace == "tenant" else tmp_path / "none.json")
    engine = Engine(EngineConfig(store=f"disk:{tmp_path / 'blocks'}", codec="fp16"), runner=runner)
    try:
        ask = dict(question=REQUESTS[0]["question"], chunks=REQUESTS[0]["chunks"], max_new_tokens=1)
        own = engine.generate(GenerateRequest(**ask, namespace="tenant")).stats
        assert (own["blend_setting"], own["recompute_ratio"]) == ("calibrated", chosen)
        other = engine.generate(GenerateRequest(**ask, namespace="other")).stats
        assert (other["blend_setting"], other["recompute_ratio"]) == ("default", BlendConfig().recompute_ratio)
    finally:
        engine.close()
    # with the adaptive ratio on, a namespace starts from its own calibration, the others from the server's
    adaptive = Engine(EngineConfig(store=f"disk:{tmp_path / 'blocks'}", codec="fp16", shadow_sample=0.5,
                                   adaptive_target=0.9, adaptive_ratios="0.05,0.7,1"), runner=runner)
    try:
        plan, source = adaptive.plan(GenerateRequest(**ask, namespace="tenant"))
        assert (source, plan.blend.recompute_ratio) == ("adaptive", chosen)
        plan, source = adaptive.plan(GenerateRequest(**ask, namespace="other"))
        assert (source, plan.blend.recompute_ratio) == ("adaptive", 0.7)
    finally:
        adaptive.close()


def test_cli_bad_requests_file_is_one_line_and_exit_2(tmp_path, capsys):
    from ragkv.cli import main

    bad = _write(tmp_path / "bad.jsonl", ["[1, 2]"])
    with pytest.raises(SystemExit) as exit_:
        main(["calibrate", "--requests", str(bad)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--requests" in err and "line 1" in err
    with pytest.raises(SystemExit) as exit_:
        main(["calibrate", "--requests", str(tmp_path / "missing.jsonl")])
    assert exit_.value.code == 2
