"""`ragkv serve --config FILE`: the settings layered defaults -> file -> environment -> flags; a bad file is
one line and exit 2."""

from __future__ import annotations

import pytest

from ragkv.cli import build_parser, main
from ragkv.commands.serve import config_from_args
from ragkv.config import ServeConfig

FILE = """
max_queue = 7
grace_s = 3
retain_memory = false
codec = "int8"
port = 50060
"""


def _config(tmp_path, argv: list[str]) -> ServeConfig:
    path = tmp_path / "ragkv.toml"
    path.write_text(FILE)
    return config_from_args(build_parser("serve").parse_args(["serve", "--config", str(path), *argv]))


def test_the_file_sets_what_the_defaults_had(tmp_path, monkeypatch):
    for name in ("RAGKV_MAX_QUEUE", "RAGKV_CODEC", "RAGKV_PORT", "RAGKV_GRACE_S", "RAGKV_RETAIN_MEMORY"):
        monkeypatch.delenv(name, raising=False)
    config = _config(tmp_path, [])
    assert (config.max_queue, config.grace_s, config.retain_memory, config.codec, config.port) == \
        (7, 3.0, False, "int8", 50060)
    assert config.host == ServeConfig().host  # what the file does not name keeps its default


def test_environment_beats_the_file_and_flags_beat_both(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGKV_MAX_QUEUE", "9")
    monkeypatch.setenv("RAGKV_CODEC", "fp16")
    monkeypatch.delenv("RAGKV_PORT", raising=False)
    config = _config(tmp_path, ["--codec", "int4"])
    assert config.max_queue == 9  # env over file
    assert config.codec == "int4"  # flag over env over file
    assert config.port == 50060  # file over default
    assert ServeConfig.load(None, {"RAGKV_MAX_QUEUE": "5"}).max_queue == 5  # no file: defaults -> env


def test_rarely_needed_settings_are_in_the_file_not_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for group in ("network and security", "model and store", "blend and quality", "performance", "observability"):
        assert f"{group}:" in out
    for flag in ("--host", "--port", "--model", "--store", "--codec", "--workers", "--token", "--tls-cert", "--tls-key",
                 "--metrics-port", "--prefill-kernel", "--decode-kernel", "--config"):  # CONTRACT's flags stay
        assert flag in out
    assert "--grace" not in out and "--max-message-bytes" not in out


@pytest.mark.parametrize("text,named", [
    ("max_queue = 'many'", "max_queue must be int"),
    ("no_such_setting = 1", "unknown setting 'no_such_setting'"),
    ("max_queue = [1", "not TOML"),
    ("codec = 'k4v2'", "unknown codec 'k4v2'"),
    ("retain_memory = 1", "retain_memory must be bool"),
])
def test_a_bad_file_is_one_line_naming_it_and_exit_2(tmp_path, capsys, text, named):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(SystemExit) as info:
        main(["serve", "--config", str(path), "--port", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ragkv serve: --config: ") and named in err[0]
    assert str(path) in err[0]


def test_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--config", str(tmp_path / "absent.toml")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--config: cannot read" in err[0] and "absent.toml" in err[0]
