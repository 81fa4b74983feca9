"""Names are checked against their registries: a newly registered mode, policy or codec is accepted by
request validation and by the serve flags with no second edit, and an unknown name is refused naming its field."""

from __future__ import annotations

import pytest

from kvstore.codecs import CODECS
from ragkv.cli import build_parser
from ragkv.commands.serve import config_from_args
from ragkv.config import ServeConfig
from workers.errors import InvalidArgument
from workers.eviction import POLICIES
from workers.modes import PREFILL_MODES
from workers.requests import CompressionSpec, GenerateRequest, mode_names, policy_names


def _request(**kwargs) -> GenerateRequest:
    return GenerateRequest(question="q", chunks=("x",), **kwargs)


def test_every_registered_mode_and_policy_is_accepted():
    assert mode_names() == tuple(PREFILL_MODES)
    assert set(policy_names()) == {"none", *POLICIES}
    for mode in PREFILL_MODES:
        assert _request(mode=mode).mode == mode
    for policy in policy_names():
        assert CompressionSpec(policy=policy, budget=0.5).policy == policy


def test_unknown_names_are_refused_naming_the_field():
    with pytest.raises(InvalidArgument, match="^mode: "):
        _request(mode="no-such-mode")
    with pytest.raises(InvalidArgument, match="^compression.policy: "):
        CompressionSpec(policy="no-such-policy")
    with pytest.raises(ValueError, match="--codec"):
        ServeConfig().with_overrides(codec="no-such-codec")


def test_a_newly_registered_mode_or_policy_needs_no_second_edit(monkeypatch):
    monkeypatch.setitem(PREFILL_MODES, "test-mode", PREFILL_MODES["full"])
    monkeypatch.setitem(POLICIES, "test-policy", next(iter(POLICIES.values())))
    assert _request(mode="test-mode").mode == "test-mode"
    assert CompressionSpec(policy="test-policy", budget=0.5).policy == "test-policy"


def test_a_newly_registered_codec_needs_no_second_edit(monkeypatch):
    monkeypatch.setitem(CODECS, "test-codec", CODECS["fp16"])
    assert ServeConfig().with_overrides(codec="test-codec").codec == "test-codec"
    assert config_from_args(build_parser("serve").parse_args(["serve", "--codec", "test-codec"])).codec == "test-codec"


def test_chunk_forms_flag_and_helm_enum_follow_the_registry():
    import json
    from pathlib import Path

    from workers.chunk_forms import CHUNK_FORMS, DEFAULT_CHUNK_FORM

    schema = json.loads((Path(__file__).parents[2] / "helm/ragkv/values.schema.json").read_text())
    assert set(schema["properties"]["server"]["properties"]["chunkForm"]["enum"]) == set(CHUNK_FORMS)
    assert set(schema["properties"]["server"]["properties"]["codec"]["enum"]) == set(CODECS)  # the chart's codecs
    assert ServeConfig().engine.chunk_form == DEFAULT_CHUNK_FORM
    args = build_parser("serve").parse_args(["serve", "--chunk-form", "alone"])
    assert config_from_args(args).engine.chunk_form == "alone"
    with pytest.raises(ValueError, match="--chunk-form"):
        ServeConfig().with_overrides(chunk_form="no-such-form")
