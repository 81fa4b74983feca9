"""pytest plugin: simulate an Intel CPU with AVX512-BF16 (torch's CPU feature probe says yes).

Patches torch.cpu._is_avx512_bf16_supported -> True, so workers.projections.native_bf16("cpu") is True and
resolve_prefill_kernel("auto") is "bf16", while tests that monkeypatch the probe themselves still work.
sitecustomize.py beside this file does the same in subprocesses (servers started by tests).
"""
import torch


def _patch():
    torch.cpu._is_avx512_bf16_supported = lambda: True


def pytest_configure(config):
    _patch()
    from workers.projections import resolve_prefill_kernel, native_bf16
    assert native_bf16("cpu") and resolve_prefill_kernel("auto") == "bf16", "force_bf16 did not take"


def pytest_report_header(config):
    from workers.projections import resolve_prefill_kernel
    return f"force_bf16: resolve_prefill_kernel('auto') = {resolve_prefill_kernel('auto')}"
