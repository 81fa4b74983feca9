"""fp16: keys then values as little-endian float16 (the uncompressed reference)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvstore.codecs.base import Codec, PayloadReader, Shape, check_shape, register_codec, to_bytes


@register_codec
@dataclass(frozen=True)
class FP16(Codec):
    name = "fp16"

    def payload_size(self, shape: Shape) -> int:
        return 2 * 2 * math.prod(check_shape(shape))

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> bytes:
        return to_bytes(keys.half(), values.half())

    def decode(self, payload: bytes, shape: Shape, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        r = PayloadReader(payload, self.payload_size(shape))
        k = r.take(torch.float16, shape)
        v = r.take(torch.float16, shape)
        return k.to(dtype), v.to(dtype)
