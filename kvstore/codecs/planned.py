"""`wk4v3`: keys per channel with widths from a per-model plan, values rotated 3-bit per token.

Keys: stored before RoPE (KVQuant), NOT rotated, so each channel keeps its own scale of importance,
and each channel gets the width its plan gives it (kvstore/codecs/allocation.py: about 4.1 bits a
channel on average, more where the queries are large, fewer where they are small). Quantized per
channel over groups of `key_group` tokens, like every KIVI-layout key. Values: `hk4v3`'s, a fixed
Hadamard rotation then `value_bits` per token over one group of the head's channels.

The plan is part of `params()`, so it travels in every block header and in the content address:
a block says how its keys were quantized, and blocks made under another plan never share an
address. With no plan every channel gets 4 bits (`make_codec("wk4v3")` works on any shape);
workers/key_plan.py measures a model's plan and builds the codec with it.

Payload, C order, little-endian. Key channels are flattened over [L, H, D] and taken by width b in
PACK_BITS order; the N_b channels of width b are padded with zero channels to R_b rows of 8:
    k_codes_b [R_b, T, b]              uint8, a row's 8 channels packed per token (quant.pack_bits)
    k_scale_b [R_b, 8, ceil(T/G)]      fp16
    k_zero_b  [R_b, 8, ceil(T/G)]      fp16
    v_codes [L, H, T, D*VB/8] | v_scale [L, H, T, ceil(D/VG)] | v_zero   (fp16 scale/zero)
At head_dim 64, 4.125 bits a key channel and 128-token key groups: keys 33 + 2 bytes a token and
head, values 24 + 4, 63 of fp16's 256 (0.246) plus the padding of the last row of each width.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from kvstore.codecs import quant, rotation
from kvstore.codecs.allocation import check_widths, parse_plan
from kvstore.codecs.base import Codec, CodecError, PayloadReader, Shape, check_group, check_shape, register_codec
from kvstore.codecs.kivi import GroupQuant
from kvstore.kernels import dispatch as kernels

ROW = 8  # channels per packed row: 8 codes of any supported width fill whole bytes


@functools.lru_cache(maxsize=16)
def width_groups(plan: str, layers: int, heads: int, dim: int) -> tuple[tuple[int, torch.Tensor], ...]:
    """((bits, channel indices [N_b] into the flattened [L*H*D] channels), ...) for each width used."""
    shape = (layers, heads, dim)
    widths = parse_plan(plan, shape).flatten() if plan else torch.full((math.prod(shape),), 4)
    return tuple((b, (widths == b).nonzero().flatten()) for b in quant.PACK_BITS if bool((widths == b).any()))


@functools.lru_cache(maxsize=16)
def channel_columns(plan: str, layers: int, heads: int, dim: int) -> torch.Tensor | None:
    """[L*H*D] each key channel's column among the decoded widths' rows (width by width in PACK_BITS order, each
    padded to whole rows of ROW), or None where that is the channels' own order (every channel one width)."""
    groups = width_groups(plan, layers, heads, dim)
    columns = torch.empty(layers * heads * dim, dtype=torch.long)
    start = 0
    for _, idx in groups:
        columns[idx] = torch.arange(start, start + idx.numel())
        start += -(-idx.numel() // ROW) * ROW
    return None if torch.equal(columns, torch.arange(columns.numel())) else columns


@register_codec
@dataclass(frozen=True)
class PlannedKeys(Codec):
    name = "wk4v3"
    pre_rope = True  # the plan's channels are the keys' own channels before rotary embedding
    key_plan: str = ""  # one width digit per key channel [L, H, D] (allocation.plan_string); "" = 4 bits each
    key_group: int = 128  # tokens per key scale
    value_bits: int = 3
    value_group: int = 0  # channels per value scale; 0 = the whole head

    def __post_init__(self) -> None:
        try:
            check_widths(self.key_plan)
        except ValueError as e:
            raise ValueError(f"{self.name}: key_plan: {e}") from None
        check_group(self.name, "key_group", self.key_group, 1)
        check_group(self.name, "value_group", self.value_group, 0)
        if self.value_bits not in quant.PACK_BITS:
            raise ValueError(f"{self.name}: value_bits must be one of {quant.PACK_BITS}, got {self.value_bits!r}")

    def params(self) -> dict:
        return {"key_plan": self.key_plan, "key_group": self.key_group, "value_bits": self.value_bits,
                "value_group": self.value_group}

    def _values(self, dim: int) -> GroupQuant:
        return GroupQuant(self.value_bits, self.value_group or dim, per_channel=False, rotated=True)

    def _groups(self, shape: Shape):
        layers, heads, _, dim = shape
        try:
            return width_groups(self.key_plan, layers, heads, dim)
        except ValueError as e:
            raise CodecError(f"{self.name}: {e}") from None

    def _counts(self, shape: Shape) -> list[tuple[int, int]]:
        """[(bits, channels)]: arithmetic only without a plan, so a forged header's huge shape allocates nothing
        (a plan is at most a header's length)."""
        if not self.key_plan:
            return [(4, shape[0] * shape[1] * shape[3])]
        return [(bits, idx.numel()) for bits, idx in self._groups(shape)]

    def payload_size(self, shape: Shape) -> int:
        layers, heads, tokens, dim = check_shape(shape)
        try:
            quant.check_pack(dim, self.value_bits)
            rotation.check_dim(dim)
        except ValueError as e:
            raise CodecError(f"{self.name} head_dim {dim}: {e}") from None
        key_groups = quant.num_groups(tokens, self.key_group)
        keys = sum(-(-count // ROW) * (tokens * bits + 2 * 2 * ROW * key_groups) for bits, count in self._counts(shape))
        return keys + self._values(dim).nbytes((layers, heads), tokens, dim)

    def encode_parts(self, keys: torch.Tensor, values: torch.Tensor) -> list[torch.Tensor]:
        shape = tuple(keys.shape)
        self.payload_size(shape)  # validates shape and plan before any work
        layers, heads, tokens, dim = shape
        channels = keys.permute(2, 0, 1, 3).reshape(tokens, layers * heads * dim)  # [T, C]
        parts = []
        for bits, idx in self._groups(shape):
            rows = -(-idx.numel() // ROW)
            x = channels.new_zeros(tokens, rows * ROW)
            x[:, : idx.numel()] = channels[:, idx.to(keys.device)]
            x = x.reshape(tokens, rows, ROW).transpose(0, 1).contiguous()  # [R, T, 8]
            parts += kernels.quantize_channel(x, bits, self.key_group)
        return parts + self._values(dim).encode(values)

    def decode(self, payload: bytes, shape: Shape, dtype: torch.dtype,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        r = PayloadReader(payload, self.payload_size(shape), device)
        layers, heads, tokens, dim = shape
        if not tokens:  # nothing stored: no channel tables to build (a forged shape may be huge)
            return (torch.empty(layers, heads, 0, dim, dtype=dtype, device=r.device),
                    torch.empty(layers, heads, 0, dim, dtype=dtype, device=r.device))
        key_groups = quant.num_groups(tokens, self.key_group)
        groups = self._groups(shape)
        columns = channel_columns(self.key_plan, layers, heads, dim)
        rows_of = [-(-idx.numel() // ROW) for _, idx in groups]
        decoded = torch.empty(tokens, sum(rows_of) * ROW, dtype=dtype, device=r.device)  # [T, padded widths' rows]
        start = 0
        for (bits, idx), rows in zip(groups, rows_of):
            codes = r.take(torch.uint8, (rows, tokens, bits))
            scale = r.take(torch.float16, (rows, ROW, key_groups))
            zero = r.take(torch.float16, (rows, ROW, key_groups))
            x = kernels.dequantize_channel(codes, scale, zero, bits, self.key_group, out_dtype=dtype)  # [R, T, 8]
            decoded[:, start: start + rows * ROW].view(tokens, rows, ROW).copy_(x.transpose(0, 1))
            start += rows * ROW
        # token-major throughout: [T, C] (C = [L, H, D]) -> [L, H, T, D] is one cheap copy
        channels = decoded if columns is None else decoded.index_select(1, columns.to(r.device))
        keys = channels.view(tokens, layers, heads, dim).permute(1, 2, 0, 3).contiguous()  # [L, H, T, D]
        return keys, self._values(dim).decode(r, (layers, heads), tokens, dim, dtype)
