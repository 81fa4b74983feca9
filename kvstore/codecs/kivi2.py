"""kivi2: KIVI-style 2-bit KV (Liu et al., 2024, "KIVI: A Tuning-Free Asymmetric 2bit
Quantization for KV Cache").

Keys have a few outlier *channels*, so they are quantized per channel: groups of
`group_size` consecutive tokens share one scale/zero per channel. Values have
no such structure and are quantized per token: groups of `group_size`
consecutive channels. A last key group shorter than `group_size` tokens is
quantized per channel over just its own tokens (stored chunks quantize every
token). With `residual` R > 0 (the decode-time cache) the most recent R tokens
are kept in fp16 instead, as KIVI does for its not-yet-full group.

Payload, all C-order, little-endian; Tq = tokens - min(R, tokens):
    k_codes  [L, H, Tq, D/4]          uint8, 4 channels per byte (quant.pack_2bit)
    k_scale  [L, H, D, ceil(Tq/G)]    fp16
    k_zero   [L, H, D, ceil(Tq/G)]    fp16
    v_codes  [L, H, Tq, D/4]          uint8
    v_scale  [L, H, Tq, ceil(D/G)]    fp16
    v_zero   [L, H, Tq, ceil(D/G)]    fp16
    k_resid  [L, H, R', D]            fp16, R' = min(R, tokens)
    v_resid  [L, H, R', D]            fp16
At D = 64, G = 32 and full key groups: 16 + 4 bytes per key vector-token,
16 + 8 per value vector: 48 bytes vs fp16's 256, 0.1875 of fp16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstore.codecs import quant
from kvstore.codecs.base import Codec, CodecError, PayloadReader, Shape, check_shape, register_codec, to_bytes


@register_codec
@dataclass(frozen=True)
class Kivi2(Codec):
    name = "kivi2"
    group_size: int = 32
    residual: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.group_size, int) or not 1 <= self.group_size <= 4096:
            raise ValueError(f"kivi2: group_size must be an int in [1, 4096], got {self.group_size!r}")
        if not isinstance(self.residual, int) or not 0 <= self.residual <= 1 << 20:
            raise ValueError(f"kivi2: residual must be an int >= 0, got {self.residual!r}")

    def params(self) -> dict:
        return {"group_size": self.group_size, "residual": self.residual}

    def _split(self, tokens: int) -> tuple[int, int]:
        resid = min(self.residual, tokens)
        return tokens - resid, resid

    def payload_size(self, shape: Shape) -> int:
        layers, heads, tokens, dim = check_shape(shape)
        if dim % 4:
            raise CodecError(f"kivi2 needs head_dim divisible by 4, got {dim}")
        tq, resid = self._split(tokens)
        lh = layers * heads
        codes = lh * tq * dim // 4
        k_meta = 2 * 2 * lh * dim * quant.num_groups(tq, self.group_size)
        v_meta = 2 * 2 * lh * tq * quant.num_groups(dim, self.group_size)
        return 2 * codes + k_meta + v_meta + 2 * 2 * lh * resid * dim

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> bytes:
        shape = tuple(keys.shape)
        self.payload_size(shape)  # validates head_dim
        tq, _ = self._split(shape[2])
        kq, k_scale, k_zero = quant.quantize_per_channel(keys[:, :, :tq], 2, self.group_size)
        vq, v_scale, v_zero = quant.quantize_per_token(values[:, :, :tq], 2, self.group_size)
        return to_bytes(
            quant.pack_2bit(kq), k_scale, k_zero,
            quant.pack_2bit(vq), v_scale, v_zero,
            keys[:, :, tq:].half(), values[:, :, tq:].half(),
        )

    def decode(self, payload: bytes, shape: Shape, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        r = PayloadReader(payload, self.payload_size(shape))
        layers, heads, tokens, dim = shape
        tq, resid = self._split(tokens)
        g = self.group_size
        k_codes = r.take(torch.uint8, (layers, heads, tq, dim // 4))
        k_scale = r.take(torch.float16, (layers, heads, dim, quant.num_groups(tq, g)))
        k_zero = r.take(torch.float16, (layers, heads, dim, quant.num_groups(tq, g)))
        v_codes = r.take(torch.uint8, (layers, heads, tq, dim // 4))
        v_scale = r.take(torch.float16, (layers, heads, tq, quant.num_groups(dim, g)))
        v_zero = r.take(torch.float16, (layers, heads, tq, quant.num_groups(dim, g)))
        k_res = r.take(torch.float16, (layers, heads, resid, dim))
        v_res = r.take(torch.float16, (layers, heads, resid, dim))
        if tq:
            k = quant.dequantize_per_channel(quant.unpack_2bit(k_codes), k_scale, k_zero, g)
            v = quant.dequantize_asym(quant.unpack_2bit(v_codes), v_scale, v_zero, g)
        else:
            k = v = torch.empty((layers, heads, 0, dim))
        keys = torch.cat((k.to(dtype), k_res.to(dtype)), dim=2) if resid else k.to(dtype)
        values = torch.cat((v.to(dtype), v_res.to(dtype)), dim=2) if resid else v.to(dtype)
        return keys, values
