"""int4: asymmetric 4-bit codes in groups along head_dim, two codes per byte.

Payload (per tensor, keys first): packed [L,H,T,D/2] | scale [L,H,T,ceil(D/G)] fp16 | zero (same)
At D = 64, G = 32: 32 + 8 bytes per token vector, 0.31 of fp16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstore.codecs import quant
from kvstore.codecs.base import CodecError, PayloadReader, PerTensorCodec, Shape, check_shape, register_codec
from kvstore.kernels import dispatch as kernels


@register_codec
@dataclass(frozen=True)
class Int4(PerTensorCodec):
    name = "int4"
    group_size: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.group_size, int) or not 1 <= self.group_size <= 4096:
            raise ValueError(f"int4: group_size must be an int in [1, 4096], got {self.group_size!r}")

    def params(self) -> dict:
        return {"group_size": self.group_size}

    def payload_size(self, shape: Shape) -> int:
        layers, heads, tokens, dim = check_shape(shape)
        if dim % 2:
            raise CodecError(f"int4 needs an even head_dim, got {dim}")
        vecs = layers * heads * tokens
        return 2 * vecs * (dim // 2 + 4 * quant.num_groups(dim, self.group_size))

    def encode_tensor(self, x: torch.Tensor) -> list[torch.Tensor]:
        codes, scale, zero = kernels.quantize_token(x, 4, self.group_size)  # codes [L,H,T,D/2]
        return [codes, scale, zero]

    def decode_tensor(self, r: PayloadReader, shape: Shape, dtype: torch.dtype) -> torch.Tensor:
        layers, heads, tokens, dim = shape
        packed = r.take(torch.uint8, (layers, heads, tokens, dim // 2))
        gshape = (layers, heads, tokens, quant.num_groups(dim, self.group_size))
        scale = r.take(torch.float16, gshape)
        zero = r.take(torch.float16, gshape)
        return kernels.dequantize_token(packed, scale, zero, 4, self.group_size, out_dtype=dtype)
