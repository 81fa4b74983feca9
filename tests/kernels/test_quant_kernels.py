"""Every Triton kernel against the torch reference: bit-exact codes and scales, float math within tolerance.

Shapes are tiny (the CPU interpreter is slow) but cover GQA head counts 3 and 8,
odd token counts, partial groups (D and T not multiples of the group, groups that
straddle a packed byte) and head_dim 64 and 128.
"""

from __future__ import annotations

import pytest
import torch

from kernel_widths import codec as width_codec
from kvstore.codecs import KiviCodec, make_codec
from kvstore.codecs.base import to_bytes
from kvstore.codecs.rotation import rotate, unrotate
from kvstore.kernels import dispatch as K

# [layers, kv_heads, tokens, head_dim]
SHAPES = [(1, 3, 7, 64), (1, 8, 5, 128), (2, 3, 33, 64)]
# (bits, group_size, symmetric): int8 (G = D), int4, KIVI-layout values (2, 3 and 4 bit); groups of 5/24
# leave partial groups; 3-bit codes straddle bytes
TOKEN_CASES = [(8, None, False), (8, None, True), (4, 32, False), (4, 5, False), (4, 24, False), (2, 32, False),
               (2, 5, False), (3, 32, False), (3, 5, False)]
# (bits, group of tokens): KIVI-layout keys, per channel
CHANNEL_CASES = [(2, 32), (2, 5), (3, 32), (3, 5), (4, 32), (4, 5)]
ATOL = 1e-5  # dequantized values are O(1) fp32; rotation adds a few ulps


def make_kv(shape, seed=0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[..., 3] *= 8  # an outlier channel, like real keys
    x[..., 0, :] = 0.5  # a constant token vector: zero scale, q = 0
    return x.to(dtype)


def inv_freq(dim: int) -> torch.Tensor:
    return 1.0 / (500000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = a.cpu().contiguous(), b.cpu().contiguous()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def on(device, t):
    """Move tensors to `device`; ints and None pass through."""
    return t.to(device) if torch.is_tensor(t) else t


def deltas(tokens: int):
    return [None, 1234, torch.arange(tokens) * 7 + 300]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits,group,symmetric", TOKEN_CASES)
def test_token_quantize_bit_exact(device, shape, bits, group, symmetric):
    x = make_kv(shape, seed=bits)
    group = group or shape[-1]
    ref = K.quantize_token(x, bits, group, symmetric, backend="torch")
    out = K.quantize_token(x.to(device), bits, group, symmetric, backend="triton")
    for r, o in zip(ref, out):
        assert same_bits(r, o)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits,group", CHANNEL_CASES)
def test_channel_quantize_bit_exact(device, shape, bits, group):
    x = make_kv(shape, seed=group)
    ref = K.quantize_channel(x, bits, group, backend="torch")
    out = K.quantize_channel(x.to(device), bits, group, backend="triton")
    for r, o in zip(ref, out):
        assert same_bits(r, o)


def test_fp16_input_bit_exact(device):
    x = make_kv((1, 3, 9, 64), dtype=torch.float16)
    assert all(same_bits(r, o) for r, o in zip(K.quantize_token(x, 4, 32, backend="torch"),
                                               K.quantize_token(x.to(device), 4, 32, backend="triton")))
    assert all(same_bits(r, o) for r, o in zip(K.quantize_channel(x, 2, 4, backend="torch"),
                                               K.quantize_channel(x.to(device), 2, 4, backend="triton")))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits,group,symmetric", TOKEN_CASES)
def test_token_dequantize_and_rerotate(device, shape, bits, group, symmetric):
    x = make_kv(shape, seed=1)
    group = group or shape[-1]
    codes, scale, zero = K.quantize_token(x, bits, group, symmetric, backend="torch")
    freq = inv_freq(shape[-1])
    for delta in deltas(shape[2]):
        ref = K.dequantize_token(codes, scale, zero, bits, group, symmetric=symmetric, delta=delta, inv_freq=freq,
                                 backend="torch")
        out = K.dequantize_token(on(device, codes), on(device, scale), on(device, zero), bits, group,
                                 symmetric=symmetric, delta=on(device, delta), inv_freq=freq.to(device), backend="triton")
        torch.testing.assert_close(out.cpu(), ref, atol=ATOL * 8, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits,group", CHANNEL_CASES)
def test_channel_dequantize_and_rerotate(device, shape, bits, group):
    x = make_kv(shape, seed=2)
    codes, scale, zero = K.quantize_channel(x, bits, group, backend="torch")
    freq = inv_freq(shape[-1])
    for delta in deltas(shape[2]):
        ref = K.dequantize_channel(codes, scale, zero, bits, group, delta=delta, inv_freq=freq, backend="torch")
        out = K.dequantize_channel(codes.to(device), scale.to(device), zero.to(device), bits, group,
                                   delta=on(device, delta),
                                   inv_freq=freq.to(device), backend="triton")
        torch.testing.assert_close(out.cpu(), ref, atol=ATOL * 8, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 3, 7, 64), (1, 8, 5, 128)])
def test_rerotate_keys(device, dtype, shape):
    keys = make_kv(shape, dtype=dtype)
    freq = inv_freq(shape[-1])
    for delta in deltas(shape[2])[1:]:
        ref = K.rerotate_keys(keys, delta, freq, backend="torch")
        out = K.rerotate_keys(keys.to(device), on(device, delta), freq.to(device), backend="triton")
        assert out.dtype == dtype
        tol = 1e-3 if dtype == torch.float16 else 1e-4  # one fp16 ulp at |x| ~ 10; cos/sin of large angles
        torch.testing.assert_close(out.cpu().float(), ref.float(), atol=tol * 8, rtol=tol)


def test_fused_out_dtype(device):
    x = make_kv((1, 3, 7, 64))
    codes, scale, zero = K.quantize_channel(x, 2, 32, backend="torch")
    freq = inv_freq(64)
    ref = K.dequantize_channel(codes, scale, zero, 2, 32, delta=40, inv_freq=freq, out_dtype=torch.float16,
                               backend="torch")
    out = K.dequantize_channel(codes.to(device), scale.to(device), zero.to(device), 2, 32, delta=40,
                               inv_freq=freq.to(device), out_dtype=torch.float16, backend="triton")
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu(), ref, atol=2e-3, rtol=1e-3)


# -- the kernels read and write the codecs' payloads ------------------------------------------


@pytest.mark.parametrize("name,params", [("int8", {}), ("int8", {"symmetric": True}), ("int4", {}),
                                         ("int4", {"group_size": 5}), ("kivi2", {}), ("kivi2", {"group_size": 4}),
                                         ("k4v2", {}), ("k3v2", {"group_size": 5}), ("k3v3", {}), ("k4v3", {}),
                                         ("k4v4", {"group_size": 4}), ("hk4v2", {}), ("hk4v3", {"key_group": 4}),
                                         ("hk4v4", {})])
def test_codec_payload_round_trip(device, name, params):
    shape = (2, 3, 9, 64)
    keys, values = make_kv(shape, seed=3), make_kv(shape, seed=4)
    codec = width_codec(name, **params)
    payload = codec.encode(keys, values)
    kivi = isinstance(codec, KiviCodec)
    turn = rotate if kivi and codec.rotate else (lambda x: x)  # rotated codecs: torch rotation, Triton quantization
    back = unrotate if kivi and codec.rotate else (lambda x: x)

    def enc(x, per_channel=False):
        if kivi:
            return K.quantize_channel(turn(x), codec.key_bits, codec.keys_quant.group_size, backend="triton") \
                if per_channel else K.quantize_token(turn(x), codec.value_bits, codec.values_quant.group_size,
                                                     backend="triton")
        if name == "int4":
            return K.quantize_token(x, 4, codec.group_size, backend="triton")
        return K.quantize_token(x, 8, shape[-1], codec.symmetric, backend="triton")

    parts = [*enc(keys.to(device), per_channel=True), *enc(values.to(device))]
    assert to_bytes(*(p.cpu() for p in parts if p is not None)) == payload

    ref_k, ref_v = codec.decode(payload, shape, torch.float32)
    kq, ks, kz, vq, vs, vz = parts  # zero is None for symmetric int8
    if kivi:
        out_k = back(K.dequantize_channel(kq, ks, kz, codec.key_bits, codec.keys_quant.group_size, backend="triton"))
        out_v = back(K.dequantize_token(vq, vs, vz, codec.value_bits, codec.values_quant.group_size, backend="triton"))
    else:
        bits, g, sym = (4, codec.group_size, False) if name == "int4" else (8, shape[-1], codec.symmetric)
        out_k = K.dequantize_token(kq, ks, kz, bits, g, symmetric=sym, backend="triton")
        out_v = K.dequantize_token(vq, vs, vz, bits, g, symmetric=sym, backend="triton")
    torch.testing.assert_close(out_k.cpu(), ref_k, atol=ATOL, rtol=1e-6)
    torch.testing.assert_close(out_v.cpu(), ref_v, atol=ATOL, rtol=1e-6)


def test_planned_codec_payload_through_triton(device, monkeypatch):
    """wk4v3 runs the same channel and token kernels: with Triton forced, the same bytes and the same KV."""
    import functools

    shape = (2, 3, 9, 64)
    keys, values = make_kv(shape, seed=5), make_kv(shape, seed=6)
    widths = [(2, 3, 4, 8)[(i * 7) % 5 % 4] for i in range(2 * 3 * 64)]  # every width, rows that need padding
    codec = make_codec("wk4v3", key_plan="".join(map(str, widths)), key_group=4)
    payload = codec.encode(keys, values)
    ref_k, ref_v = codec.decode(payload, shape, torch.float32)
    for op in ("quantize_channel", "quantize_token", "dequantize_channel", "dequantize_token"):
        monkeypatch.setattr(K, op, functools.partial(getattr(K, op), backend="triton"))
    assert codec.encode(keys.to(device), values.to(device)) == payload
    out_k, out_v = codec.decode(payload, shape, torch.float32, device=device)
    torch.testing.assert_close(out_k.cpu(), ref_k, atol=ATOL, rtol=1e-6)
    torch.testing.assert_close(out_v.cpu(), ref_v, atol=ATOL, rtol=1e-6)


def test_empty_tokens(device):
    x = torch.zeros(1, 3, 0, 64, device=device)
    codes, scale, zero = K.quantize_channel(x, 2, 32, backend="triton")
    assert codes.shape == (1, 3, 0, 16) and scale.shape == (1, 3, 64, 0)
    assert K.dequantize_channel(codes, scale, zero, 2, 32, backend="triton").shape == (1, 3, 0, 64)
