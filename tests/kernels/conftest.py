"""Kernel tests: Triton vs the torch reference.

On CPU the kernels run under the Triton interpreter, which must be switched on
before triton is first imported (kvstore.kernels imports it lazily, on first use).
deploy/gpu_check.sh runs this directory with RAGKV_KERNEL_DEVICE=cuda and `-m kernels`.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("RAGKV_KERNEL_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/kernels/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.kernels)


@pytest.fixture(scope="session")
def device() -> torch.device:
    if DEVICE != "cpu" and not torch.cuda.is_available():
        pytest.fail(f"RAGKV_KERNEL_DEVICE={DEVICE} but torch sees no CUDA device")
    return torch.device(DEVICE)
