"""deploy/gpu_check.sh and ragkv.bench.gpu refuse, fast and clearly, without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")


def _no_cuda_env():
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}


def test_module_refuses_without_cuda(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-m", "ragkv.bench.gpu", "--json", str(out)], cwd=REPO,
                          env=_no_cuda_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "no CUDA device" in proc.stderr
    assert not out.exists()


def test_script_refuses_without_cuda(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "deploy" / "gpu_check.sh"), str(tmp_path / "gpu.json")], cwd=REPO,
                          env=_no_cuda_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "no CUDA device" in proc.stderr
