"""Backend choice: Triton only for CUDA tensors (or when asked), the torch reference otherwise; codecs
follow it, and the host/device copies are explicit, guarded steps."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from kvstore.codecs import CODECS, make_codec
from kernel_widths import codec as width_codec
from kvstore.codecs.base import to_bytes
from kvstore.kernels import dispatch, transfer


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
        dispatch.quantize_token(torch.zeros(1, 2, 8), 5, 4)
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


# -- codecs pick their kernels by device; the host copy is an explicit, guarded step ------------------

SHAPE = (2, 3, 9, 64)


def _kv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_cpu_codecs_never_touch_triton(monkeypatch, name):
    def boom():
        raise AssertionError("a CPU tensor reached the Triton kernels")

    monkeypatch.setattr(dispatch, "_kernels", boom)
    keys, values = _kv()
    codec = make_codec(name)
    k, v = codec.decode(codec.encode(keys, values), SHAPE, torch.float32)
    assert k.shape == SHAPE and v.device.type == "cpu"


@pytest.mark.parametrize("name", ["int8", "int4", "kivi2", "k4v2", "k3v2", "k4v4"])
def test_codec_on_the_triton_path_writes_the_same_bytes(monkeypatch, name):
    """What a CUDA tensor gets (Triton, here under TRITON_INTERPRET=1) is byte for byte the torch path."""
    keys, values = _kv(1)
    codec = width_codec(name)
    ref = codec.encode(keys, values)
    ref_k, ref_v = codec.decode(ref, SHAPE, torch.float32)
    monkeypatch.setattr(dispatch, "resolve_backend", lambda tensor, backend=None: "triton")
    assert codec.encode(keys, values) == ref
    k, v = codec.decode(ref, SHAPE, torch.float32)
    torch.testing.assert_close(k, ref_k, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(v, ref_v, atol=1e-5, rtol=1e-6)


def test_to_bytes_refuses_device_tensors():
    with pytest.raises(ValueError, match="host"):
        to_bytes(torch.zeros(4, device="meta"))


def test_to_host_passes_host_tensors_through():
    parts = [torch.arange(6, dtype=torch.uint8), None, torch.ones(2, 3, dtype=torch.float16)]
    out = transfer.to_host(parts)
    assert len(out) == 2 and out[0].data_ptr() == parts[0].data_ptr() and out[1].data_ptr() == parts[2].data_ptr()
    buf = torch.arange(5, dtype=torch.uint8)
    assert transfer.to_device(buf, "cpu") is buf


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA guard")
def test_pinned_buffers_only_with_cuda():
    assert transfer.pinned_ok() is False


@pytest.mark.parametrize("name", ["fp16", "int4", "k4v2", "k3v2"])
def test_decode_moves_the_payload_to_the_device_once(monkeypatch, name):
    """decode(device=...) copies the payload there in one piece and dequantizes there (meta stands in for CUDA)."""
    calls = []
    real = transfer.to_device
    monkeypatch.setattr(transfer, "to_device", lambda buf, device: calls.append(buf.numel()) or real(buf, device))
    keys, values = _kv()
    codec = width_codec(name)
    payload = codec.encode(keys, values)
    k, v = codec.decode(payload, SHAPE, torch.float16, device="meta")
    assert calls == [len(payload)]
    assert k.device.type == v.device.type == "meta" and k.shape == SHAPE and k.dtype == torch.float16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["int4", "k4v2", "k3v2"])
def test_cuda_encode_decode_matches_cpu(name):
    keys, values = _kv(2)
    codec = width_codec(name)
    ref = codec.encode(keys, values)
    assert to_bytes(*transfer.to_host(codec.encode_parts(keys.cuda(), values.cuda()))) == ref
    k, v = codec.decode(ref, SHAPE, torch.float32, device="cuda")
    ref_k, ref_v = codec.decode(ref, SHAPE, torch.float32)
    assert k.is_cuda
    torch.testing.assert_close(k.cpu(), ref_k, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(v.cpu(), ref_v, atol=1e-5, rtol=1e-6)
