"""fp16: keys then values as little-endian float16 (the uncompressed reference)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvstore.codecs.base import PayloadReader, PerTensorCodec, Shape, check_shape, register_codec


@register_codec
@dataclass(frozen=True)
class FP16(PerTensorCodec):
    name = "fp16"

    def payload_size(self, shape: Shape) -> int:
        return 2 * 2 * math.prod(check_shape(shape))

    def encode_tensor(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x.half()]

    def decode_tensor(self, reader: PayloadReader, shape: Shape, dtype: torch.dtype) -> torch.Tensor:
        return reader.take(torch.float16, shape)
