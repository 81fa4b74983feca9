"""fp32: keys then values as little-endian float32, lossless for fp32, bf16 and fp16 KV.

The engine stores the system-prompt prefix with it: `prefix` mode reuses it as an exact prefix, as vLLM's
prefix cache does, so its KV is what a full prefill computes, not a rounding of it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvstore.codecs.base import PayloadReader, PerTensorCodec, Shape, check_shape, register_codec


@register_codec
@dataclass(frozen=True)
class FP32(PerTensorCodec):
    name = "fp32"

    def payload_size(self, shape: Shape) -> int:
        return 2 * 4 * math.prod(check_shape(shape))

    def encode_tensor(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x.float()]

    def decode_tensor(self, reader: PayloadReader, shape: Shape, dtype: torch.dtype) -> torch.Tensor:
        return reader.take(torch.float32, shape)
