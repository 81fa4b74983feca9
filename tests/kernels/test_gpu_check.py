"""deploy/gpu_check.sh and ragkv.bench.gpu refuse, fast and clearly, without CUDA; their measuring
functions smoke-run on CPU."""

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


def test_measurements_run_on_cpu_under_the_interpreter():
    """The GPU check's measuring functions, smoke-run on tiny CPU shapes (Triton interpreted), so a lent GPU's
    few minutes are not spent finding a typo. Figures here mean nothing; only the structure is checked."""
    from ragkv.bench import gpu

    copy = gpu.copy_bandwidth(torch, 1 << 16, 1, device="cpu")
    ops = gpu.kernel_bandwidth(torch, (1, 3, 8, 64), 1, copy, device="cpu")
    assert {"kivi2_keys_dequant_rerotate", "rerotate_fp16"} <= set(ops)
    assert any(name.endswith("_keys_dequant_rotate") for name in ops)
    for row in ops.values():
        assert row["triton"]["ms"] > 0 and row["torch"]["ms"] > 0 and row["fraction_of_copy_bw"] >= 0
    trip = gpu.block_round_trip(torch, (2, 3, 8, 64), 1, device="cpu")
    assert trip["bytes_equal_cpu"] and trip["payload_bytes"] > 0 and trip["decode_mb_s"] > 0
