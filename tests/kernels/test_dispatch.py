"""Backend choice: Triton only for CUDA tensors (or when asked), the torch reference otherwise."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from kvstore.kernels import dispatch


def test_cpu_tensors_use_the_reference():
    assert dispatch.resolve_backend(torch.zeros(1)) == "torch"
    assert dispatch.resolve_backend(torch.zeros(1), "triton") == "triton"


def test_force_torch_env_wins(monkeypatch):
    monkeypatch.setenv("RAGKV_FORCE_TORCH", "1")
    assert dispatch.resolve_backend(torch.zeros(1), "triton") == "torch"
    assert dispatch.resolve_backend(torch.zeros(1), "auto") == "torch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_use_triton(monkeypatch):
    monkeypatch.delenv("RAGKV_FORCE_TORCH", raising=False)
    x = torch.zeros(1, device="cuda")
    assert dispatch.resolve_backend(x) == "triton"
    assert dispatch.resolve_backend(x, "torch") == "torch"


def test_bad_backend_and_bits():
    with pytest.raises(ValueError, match="backend"):
        dispatch.resolve_backend(torch.zeros(1), "cuda")
    with pytest.raises(ValueError, match="bits"):
        dispatch.quantize_token(torch.zeros(1, 2, 8), 3, 4)
    with pytest.raises(ValueError, match="symmetric"):
        dispatch.quantize_token(torch.zeros(1, 2, 8), 4, 4, symmetric=True)
    with pytest.raises(ValueError, match="divisible"):
        dispatch.quantize_channel(torch.zeros(1, 2, 6), 2, 4)
    with pytest.raises(ValueError, match="inv_freq"):
        dispatch.rerotate_keys(torch.zeros(1, 2, 8), 3, None, backend="triton")


def test_importing_kvstore_does_not_import_triton():
    code = ("import sys, kvstore, kvstore.kernels, kvstore.kernels.dispatch, kvstore.codecs, workers.blend; "
            "sys.exit(1 if 'triton' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
