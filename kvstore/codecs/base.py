"""Codec: KV tensors <-> payload bytes. A codec is a small frozen dataclass.

A codec's `params()` go into every block header and into the content address,
so two codecs that would produce different bytes never share an address.
Compression (lz4) is the block layer's job, not the codec's.

Encoding is two steps, so KV computed on a GPU is quantized there and only the
packed bytes cross to the host: `encode_parts(keys, values)` returns the payload's
tensors, in order, on the input's device (Triton kernels on CUDA, the torch
reference elsewhere: kvstore/kernels/dispatch.py); `to_bytes` concatenates host
tensors (kvstore/kernels/transfer.py:to_host makes the copy). `decode(...,
device=)` moves the payload to the device once and dequantizes it there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from kvstore.plugins import HINT
from kvstore.registry import Registry, add_unique

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

    # keys are stored before rotary embedding (KVQuant): a block layer concern, see kvstore/block.py
    pre_rope: ClassVar[bool] = False

    def payload_size(self, shape: Shape) -> int:
        """Exact byte length of encode() for this shape: the decoder checks it before allocating."""
        raise NotImplementedError

    def encode_parts(self, keys: torch.Tensor, values: torch.Tensor) -> list[torch.Tensor]:
        """The payload as tensors on the input's device; their raw bytes, in order, are the payload."""
        raise NotImplementedError

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> bytes:
        from kvstore.kernels.transfer import to_host

        return to_bytes(*to_host(self.encode_parts(keys, values)))

    def decode(self, payload: bytes, shape: Shape, dtype: torch.dtype,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """payload -> keys, values [L, H, T, D] of `dtype` on `device` (default CPU)."""
        raise NotImplementedError


@dataclass(frozen=True)
class PerTensorCodec(Codec):
    """A codec that treats keys and values alike: the payload is encode_tensor(keys) + encode_tensor(values)."""

    def encode_tensor(self, x: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError

    def decode_tensor(self, reader: "PayloadReader", shape: Shape, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def encode_parts(self, keys: torch.Tensor, values: torch.Tensor) -> list[torch.Tensor]:
        self.payload_size(tuple(keys.shape))  # validates the shape before any work
        return [*self.encode_tensor(keys), *self.encode_tensor(values)]

    def decode(self, payload: bytes, shape: Shape, dtype: torch.dtype,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        reader = PayloadReader(payload, self.payload_size(shape), device)
        keys = self.decode_tensor(reader, shape, dtype)
        values = self.decode_tensor(reader, shape, dtype)
        return keys.to(dtype), values.to(dtype)


CODECS: Registry = Registry()  # name -> type[Codec]; plug-ins (research/) may add more


def register_codec(cls: type[Codec]) -> type[Codec]:
    if not cls.name:
        raise ValueError("a codec needs a name")
    add_unique(CODECS, "codec", cls.name, cls)
    return cls


def make_codec(name: str, **params) -> Codec:
    try:
        cls = CODECS[name]
    except KeyError:
        raise CodecError(f"unknown codec {name!r}; known: {sorted(CODECS)}; {HINT}") from None
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
    """Concatenate the raw little-endian bytes of contiguous host tensors.

    Device tensors are refused: the device -> host copy is an explicit step
    (kvstore.kernels.transfer.to_host), never a hidden one here."""
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError(f"to_bytes needs host tensors, got one on {t.device}; copy with transfer.to_host")
    return b"".join(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors if t.numel())


class PayloadReader:
    """Cuts a payload into typed tensors, in order; the total length is checked up front.

    With a `device`, the whole payload is copied there once (kvstore.kernels.transfer.to_device)
    and every tensor taken is a view of that one device buffer."""

    def __init__(self, payload: bytes, expected: int, device: torch.device | str | None = None):
        if len(payload) != expected:
            raise CodecError(f"payload is {len(payload)} bytes, expected {expected}")
        # one writable copy so torch.frombuffer can share it without warnings
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
        if device is not None and torch.device(device).type != "cpu":
            from kvstore.kernels.transfer import to_device

            buf = to_device(buf, device)
        self._buf = buf
        self._pos = 0

    @property
    def device(self) -> torch.device:
        return self._buf.device

    def take(self, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        count = math.prod(shape)
        size = torch.empty((), dtype=dtype).element_size()
        start, self._pos = self._pos, self._pos + count * size
        if count == 0:
            return torch.empty(shape, dtype=dtype, device=self._buf.device)
        raw = self._buf[start:self._pos]
        if start % size:  # a typed view needs an aligned offset: copy this part out
            raw = raw.clone()
        return raw.view(dtype).reshape(shape)


def check_group(codec: str, field: str, value, low: int) -> None:
    """ValueError unless a group-size field is an int (not a bool) in [low, 4096]."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= 4096:
        raise ValueError(f"{codec}: {field} must be an int in [{low}, 4096], got {value!r}")


def check_shape(shape: Shape) -> Shape:
    if len(shape) != 4 or any((not isinstance(s, int)) or s < 0 for s in shape):
        raise CodecError(f"shape must be 4 non-negative ints, got {shape!r}")
    return tuple(shape)  # type: ignore[return-value]
