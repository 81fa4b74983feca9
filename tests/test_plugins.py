"""Plug-ins (kvstore/plugins.py): names moved to research/ are a clear error without it, and work again
when research is installed (its `ragkv.plugins` entry point, found through importlib.metadata)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.codecs import CODECS, CodecError, make_codec
from kvstore.plugins import GROUP
from workers.selection import SELECTIONS

ROOT = Path(__file__).resolve().parents[1]
MOVED_CODECS = ("k4v2", "hk4v3")
MOVED_METHODS = ("legolink", "attended-gradual", "strided")


@pytest.mark.parametrize("name", MOVED_CODECS)
def test_a_moved_codec_is_a_value_error_naming_it(name):
    assert name not in CODECS  # research is not installed in the product's environment
    with pytest.raises(CodecError, match=f"unknown codec '{name}'.*research") as info:
        make_codec(name)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", MOVED_METHODS)
def test_a_moved_selection_method_is_a_value_error_naming_it(name):
    from workers.blend import BlendConfig

    assert name not in SELECTIONS
    with pytest.raises(ValueError, match=f"unknown blend method '{name}'"):
        BlendConfig(method=name)


def test_a_moved_codec_flag_is_one_line_and_exit_2(capsys):
    from ragkv.cli import main

    with pytest.raises(SystemExit) as info:
        main(["serve", "--codec", "k4v2", "--port", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--codec" in err[0] and "'k4v2'" in err[0]


def test_research_installed_registers_the_moved_names(tmp_path):
    """An installed research (a dist-info whose entry point is research's register function) on a fresh
    interpreter: the first lookup of a name the product lacks loads it, and every moved name works."""
    info = tmp_path / "ragkv_research-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ragkv-research\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\nresearch = ragkv_research.plugin:register\n")
    script = (
        "from kvstore.codecs import CODECS, make_codec\n"
        "from workers.selection import SELECTIONS\n"
        f"assert not set({MOVED_CODECS!r}) & set(CODECS.keys())\n"
        f"print(sorted(type(make_codec(n)).__name__ for n in {MOVED_CODECS!r}))\n"
        f"print(all(n in SELECTIONS for n in {MOVED_METHODS!r}))\n"
        "from workers.requests import GenerateRequest\n"
        "print(GenerateRequest(question='q', chunks=('c',), mode='shift').mode)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "research"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["['HK4V3',", "'K4V2']", "True", "shift"]


def test_a_moved_mode_is_invalid_argument_naming_mode():
    """`shift` (reuse after the context drift) moved to research: without it, a request asking for it is
    INVALID_ARGUMENT naming `mode` (the gRPC layer maps InvalidArgument to that status)."""
    from workers.errors import InvalidArgument
    from workers.requests import GenerateRequest

    with pytest.raises(InvalidArgument, match="shift") as info:
        GenerateRequest(question="q", chunks=("c",), mode="shift")
    assert info.value.field == "mode"
