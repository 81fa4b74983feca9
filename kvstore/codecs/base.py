"""Codec: KV tensors <-> payload bytes. A codec is a small frozen dataclass.

A codec's `params()` go into every block header and into the content address,
so two codecs that would produce different bytes never share an address.
Compression (lz4) is the block layer's job, not the codec's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

Shape = tuple[int, int, int, int]  # [layers, kv_heads, tokens, head_dim]


class CodecError(ValueError):
    """The payload does not fit the codec and shape (wrong length, bad parameters)."""


@dataclass(frozen=True)
class Codec:
    name: ClassVar[str] = ""

    def params(self) -> dict:
        """Everything that changes the encoded bytes (JSON-serialisable)."""
        return {}

    def spec(self) -> dict:
        return {"name": self.name, "params": self.params()}

    def payload_size(self, shape: Shape) -> int:
        """Exact byte length of encode() for this shape: the decoder checks it before allocating."""
        raise NotImplementedError

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> bytes:
        raise NotImplementedError

    def decode(self, payload: bytes, shape: Shape, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


@dataclass(frozen=True)
class PerTensorCodec(Codec):
    """A codec that treats keys and values alike: the payload is encode_tensor(keys) + encode_tensor(values)."""

    def encode_tensor(self, x: torch.Tensor) -> bytes:
        raise NotImplementedError

    def decode_tensor(self, reader: "PayloadReader", shape: Shape) -> torch.Tensor:
        raise NotImplementedError

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> bytes:
        self.payload_size(tuple(keys.shape))  # validates the shape before any work
        return self.encode_tensor(keys) + self.encode_tensor(values)

    def decode(self, payload: bytes, shape: Shape, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        reader = PayloadReader(payload, self.payload_size(shape))
        keys = self.decode_tensor(reader, shape)
        values = self.decode_tensor(reader, shape)
        return keys.to(dtype), values.to(dtype)


CODECS: dict[str, type[Codec]] = {}


def register_codec(cls: type[Codec]) -> type[Codec]:
    if not cls.name or cls.name in CODECS:
        raise ValueError(f"codec name {cls.name!r} is empty or taken")
    CODECS[cls.name] = cls
    return cls


def make_codec(name: str, **params) -> Codec:
    try:
        cls = CODECS[name]
    except KeyError:
        raise CodecError(f"unknown codec {name!r}; known: {sorted(CODECS)}") from None
    try:
        return cls(**params)
    except TypeError as e:  # unknown parameter name
        raise CodecError(f"codec {name!r}: {e}") from None


def codec_from_spec(spec: "str | dict | Codec") -> Codec:
    """'kivi2' | {'name': 'kivi2', 'params': {...}} | a Codec -> a Codec (defaults filled in)."""
    if isinstance(spec, Codec):
        return spec
    if isinstance(spec, str):
        return make_codec(spec)
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("params", {}), dict):
        raise CodecError(f"bad codec spec {spec!r}")
    return make_codec(spec["name"], **spec.get("params", {}))


# -- byte helpers shared by the codecs --------------------------------------------

def to_bytes(*tensors: torch.Tensor) -> bytes:
    """Concatenate the raw little-endian bytes of contiguous tensors."""
    return b"".join(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors if t.numel())


class PayloadReader:
    """Cuts a payload into typed tensors, in order; the total length is checked up front."""

    def __init__(self, payload: bytes, expected: int):
        if len(payload) != expected:
            raise CodecError(f"payload is {len(payload)} bytes, expected {expected}")
        # one writable copy so torch.frombuffer can share it without warnings
        self._buf = bytearray(payload)
        self._pos = 0

    def take(self, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        count = math.prod(shape)
        nbytes = count * torch.tensor([], dtype=dtype).element_size()
        if count == 0:
            self._pos += nbytes
            return torch.empty(shape, dtype=dtype)
        t = torch.frombuffer(self._buf, dtype=dtype, count=count, offset=self._pos).reshape(shape)
        self._pos += nbytes
        return t


def check_shape(shape: Shape) -> Shape:
    if len(shape) != 4 or any((not isinstance(s, int)) or s < 0 for s in shape):
        raise CodecError(f"shape must be 4 non-negative ints, got {shape!r}")
    return tuple(shape)  # type: ignore[return-value]
