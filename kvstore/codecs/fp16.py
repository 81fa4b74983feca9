"""fp16: keys then values as little-endian float16 (the uncompressed reference); fp32 the same in float32."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from kvstore.codecs.base import PayloadReader, PerTensorCodec, Shape, check_shape, register_codec


@register_codec
@dataclass(frozen=True)
class FP16(PerTensorCodec):
    name = "fp16"
    dtype: ClassVar[torch.dtype] = torch.float16

    def payload_size(self, shape: Shape) -> int:
        return 2 * self.dtype.itemsize * math.prod(check_shape(shape))

    def encode_tensor(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x.to(self.dtype)]

    def decode_tensor(self, reader: PayloadReader, shape: Shape, dtype: torch.dtype) -> torch.Tensor:
        return reader.take(self.dtype, shape)


@register_codec
@dataclass(frozen=True)
class FP32(FP16):
    """Lossless for fp32, bf16 and fp16 KV. The engine stores the system-prompt prefix with it: `prefix` mode
    reuses it as an exact prefix, as vLLM's prefix cache does, so its KV is what a full prefill computes."""

    name = "fp32"
    dtype: ClassVar[torch.dtype] = torch.float32
