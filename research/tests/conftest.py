"""Research tests: `pytest research/tests` from the repository root (not part of `make test`).

research/ is put on sys.path and its plug-in registered directly, as the `ragkv.plugins` entry point
would when research is installed (pip install -e research/)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

RESEARCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(RESEARCH))

from ragkv_research.plugin import register  # noqa: E402

register()


@pytest.fixture(scope="session")
def runner():
    """The real default model, loaded once per test session (as tests/conftest.py does)."""
    os.environ.setdefault("RAGKV_CACHE_DIR", str(Path.home() / ".cache" / "ragkv"))
    from workers.runner import ModelRunner

    return ModelRunner.load("default")


@pytest.fixture(scope="session")
def real_kv(runner):
    """One real chunk (85 tokens) from the default model: [30, 3, 85, 64] float keys/values."""
    sys.path.insert(0, str(RESEARCH.parent / "tests" / "kvstore"))
    from kvstore_helpers import TEXT

    return runner.chunk_kv(runner.tokenize(TEXT))
