"""KIVI-layout codecs: keys per channel, values per token, each with its own bit width.

KIVI (Liu et al., 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
Cache") found that keys have a few outlier *channels*, so keys are quantized per
channel: groups of `group_size` consecutive tokens share one scale/zero per
channel. Values have no such structure and are quantized per token, in groups of
`group_size` consecutive channels. This project's codec study, and an independent
check with transformers' QuantizedCache, found that on the default model the 2-bit
damage is in the keys, so the widths are split: `k4v2` = keys 4-bit, values 2-bit.

One implementation (`KiviCodec` over two `GroupQuant`s); every registered name is a
small dataclass that fixes its widths. The product registers `kivi2`; the other widths (k3v2 ... k4v4)
and the rotated `h` codecs (pre-RoPE keys, head dimension rotated by a fixed Hadamard matrix,
kvstore/codecs/rotation.py, longer groups: `key_group` = 128 tokens, `value_group` = 64 channels)
are research (research/ragkv_research/codecs.py) and register themselves from there.

With `residual` R > 0 (a decode-time cache) the most recent R tokens stay fp16. With `pre_rope`
the block layer stores the keys before rotary embedding (KVQuant, Hooper et al., 2024): see
kvstore/block.py. G below is the key group (tokens) or the value group (channels).

Payload, all C-order, little-endian; Tq = tokens - min(R, tokens), KB/VB = key/value bits:
    k_codes  [L, H, Tq, D*KB/8]       uint8, quant.pack_bits along D
    k_scale  [L, H, D, ceil(Tq/G)]    fp16
    k_zero   [L, H, D, ceil(Tq/G)]    fp16
    v_codes  [L, H, Tq, D*VB/8]       uint8
    v_scale  [L, H, Tq, ceil(D/G)]    fp16
    v_zero   [L, H, Tq, ceil(D/G)]    fp16
    k_resid  [L, H, R', D]            fp16, R' = min(R, tokens)
    v_resid  [L, H, R', D]            fp16
Bytes per (layer, head, token) at D = 64, G = 32, full key groups, scales and zeros
counted: keys 8*KB + 8, values 8*VB + 8, against fp16's 256:
    kivi2 48 (0.1875)  k3v2 56 (0.219)  k3v3 64 (0.25)  k4v2 64 (0.25)  k4v3 72 (0.281)  k4v4 80 (0.3125)
and for the rotated codecs (key groups of 128 tokens, one value group of 64 channels), keys 8*KB + 2,
values 8*VB + 4:  hk4v2 54 (0.211)  hk3v4 62 (0.242)  hk4v3 62 (0.242)  hk4v4 70 (0.273)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvstore.codecs import quant, rotation
from kvstore.codecs.base import Codec, CodecError, PayloadReader, Shape, check_group, check_shape, register_codec
from kvstore.kernels import dispatch as kernels

Lead = tuple[int, ...]  # leading axes, [L, H]


@dataclass(frozen=True)
class GroupQuant:
    """One tensor's quantizer: asymmetric `bits`-bit codes, groups of `group_size` along tokens
    (per_channel: one scale/zero per channel per token group) or along channels (per token)."""

    bits: int
    group_size: int
    per_channel: bool
    rotated: bool = False  # quantize x·R, decode to y·Rᵀ (rotation.py)

    def meta_shape(self, lead: Lead, tokens: int, dim: int) -> tuple[int, ...]:
        if self.per_channel:
            return (*lead, dim, quant.num_groups(tokens, self.group_size))
        return (*lead, tokens, quant.num_groups(dim, self.group_size))

    def nbytes(self, lead: Lead, tokens: int, dim: int) -> int:
        codes = math.prod(lead) * tokens * dim * self.bits // 8
        return codes + 2 * 2 * math.prod(self.meta_shape(lead, tokens, dim))

    def encode(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x [..., T, D] -> [codes [..., T, D*bits/8], scale, zero] on x's device."""
        op = kernels.quantize_channel if self.per_channel else kernels.quantize_token
        return list(op(rotation.rotate(x) if self.rotated else x, self.bits, self.group_size))

    def decode(self, r: PayloadReader, lead: Lead, tokens: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        codes = r.take(torch.uint8, (*lead, tokens, dim * self.bits // 8))
        scale = r.take(torch.float16, self.meta_shape(lead, tokens, dim))
        zero = r.take(torch.float16, self.meta_shape(lead, tokens, dim))
        if not tokens:
            return torch.empty((*lead, 0, dim), dtype=dtype, device=r.device)
        op = kernels.dequantize_channel if self.per_channel else kernels.dequantize_token
        if not self.rotated:
            return op(codes, scale, zero, self.bits, self.group_size, out_dtype=dtype)
        return rotation.unrotate(op(codes, scale, zero, self.bits, self.group_size, out_dtype=torch.float32), dtype)


@dataclass(frozen=True)
class KiviCodec(Codec):
    """Keys `key_bits` per channel, values `value_bits` per token (a subclass fixes both)."""

    key_bits = 2
    value_bits = 2
    group_size: int = 32
    residual: int = 0
    pre_rope: bool = False
    key_group: int = 0  # tokens per key scale; 0 = group_size
    value_group: int = 0  # channels per value scale; 0 = group_size
    rotate: bool = False  # Hadamard-rotate the head dimension of keys and values first

    def __post_init__(self) -> None:
        for name in ("group_size", "key_group", "value_group"):
            check_group(self.name, name, getattr(self, name), 1 if name == "group_size" else 0)
        if not isinstance(self.rotate, bool):
            raise ValueError(f"{self.name}: rotate must be a bool, got {self.rotate!r}")
        if not isinstance(self.residual, int) or isinstance(self.residual, bool) or not 0 <= self.residual <= 1 << 20:
            raise ValueError(f"{self.name}: residual must be an int >= 0, got {self.residual!r}")
        if not isinstance(self.pre_rope, bool):
            raise ValueError(f"{self.name}: pre_rope must be a bool, got {self.pre_rope!r}")

    def params(self) -> dict:
        return {"group_size": self.group_size, "residual": self.residual, "pre_rope": self.pre_rope,
                "key_group": self.key_group, "value_group": self.value_group, "rotate": self.rotate}

    @property
    def keys_quant(self) -> GroupQuant:
        return GroupQuant(self.key_bits, self.key_group or self.group_size, per_channel=True, rotated=self.rotate)

    @property
    def values_quant(self) -> GroupQuant:
        return GroupQuant(self.value_bits, self.value_group or self.group_size, per_channel=False, rotated=self.rotate)

    def _split(self, tokens: int) -> tuple[int, int]:
        resid = min(self.residual, tokens)
        return tokens - resid, resid

    def payload_size(self, shape: Shape) -> int:
        layers, heads, tokens, dim = check_shape(shape)
        try:
            quant.check_pack(dim, self.key_bits)
            quant.check_pack(dim, self.value_bits)
            if self.rotate:
                rotation.check_dim(dim)
        except ValueError as e:
            raise CodecError(f"{self.name} head_dim {dim}: {e}") from None
        tq, resid = self._split(tokens)
        lead = (layers, heads)
        return (self.keys_quant.nbytes(lead, tq, dim) + self.values_quant.nbytes(lead, tq, dim)
                + 2 * 2 * layers * heads * resid * dim)

    def encode_parts(self, keys: torch.Tensor, values: torch.Tensor) -> list[torch.Tensor]:
        shape = tuple(keys.shape)
        self.payload_size(shape)  # validates head_dim
        tq, _ = self._split(shape[2])
        return [*self.keys_quant.encode(keys[:, :, :tq]), *self.values_quant.encode(values[:, :, :tq]),
                keys[:, :, tq:].half(), values[:, :, tq:].half()]

    def decode(self, payload: bytes, shape: Shape, dtype: torch.dtype,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        r = PayloadReader(payload, self.payload_size(shape), device)
        layers, heads, tokens, dim = shape
        tq, resid = self._split(tokens)
        k = self.keys_quant.decode(r, (layers, heads), tq, dim, dtype)
        v = self.values_quant.decode(r, (layers, heads), tq, dim, dtype)
        k_res = r.take(torch.float16, (layers, heads, resid, dim))
        v_res = r.take(torch.float16, (layers, heads, resid, dim))
        if not resid:
            return k, v
        return torch.cat((k, k_res.to(dtype)), dim=2), torch.cat((v, v_res.to(dtype)), dim=2)


def widths_codec(name: str, key_bits: int, value_bits: int, pre_rope: bool, doc: str, module: str = __name__,
                 **defaults) -> type[KiviCodec]:
    """A KIVI-layout codec class `name` (not registered): a KiviCodec subclass that fixes the widths and
    the defaults of pre_rope and of any other field given in `defaults`. `module`: the module that binds
    the class to NAME.upper() (pickling finds it there)."""
    defaults = {"pre_rope": pre_rope, **defaults}
    cls = type(name.upper(), (KiviCodec,), {
        "__doc__": doc, "__module__": module, "__qualname__": name.upper(),
        "__annotations__": {k: KiviCodec.__dataclass_fields__[k].type for k in defaults},
        "name": name, "key_bits": key_bits, "value_bits": value_bits, **defaults})
    return dataclass(frozen=True)(cls)


def register_widths(*args, **kwargs) -> type[KiviCodec]:
    """`widths_codec(...)`, registered (research/ registers the other widths from its own module)."""
    return register_codec(widths_codec(*args, **kwargs))


Kivi2 = register_widths("kivi2", 2, 2, False,
                        "KIVI's 2-bit keys and values: available, not the default (2-bit keys cost answers).")
