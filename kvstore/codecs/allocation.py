"""Bit allocation over key channels (reverse water-filling), as plain torch functions.

A key channel's quantization error reaches the attention logits multiplied by the query in that
channel: logit error = sum_c q_c e_c. With per-channel uniform quantization over a range that
scales with the channel's spread s_c, E[e_c^2] ~ s_c^2 / (2^b - 1)^2, so the logit error of a
channel given b bits is about weight_c / (2^b - 1)^2 with weight_c = E[q_c^2] * s_c^2. Channels
differ in weight by orders of magnitude (a few RoPE pairs carry most of the query energy), so
equal widths waste bits: `allocate` spends a fixed total where it lowers that sum the most
(the classic reverse water-filling of rate-distortion theory, over the integer widths the
packing supports). workers/key_plan.py measures the weights on a model; kvstore/codecs/planned.py
stores keys with the widths.

A plan is written as one digit per channel, [L, H, D] in C order ("4438..."): it travels in the
codec's params, so every block says how it was quantized and the content address covers it.
"""

from __future__ import annotations

import torch

from kvstore.codecs.quant import PACK_BITS


def distortion(weight: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """weight [N], bits [N] -> the modelled logit error of each channel: weight / (2^bits - 1)^2."""
    return weight / (2.0 ** bits.double() - 1) ** 2


def allocate(weight: torch.Tensor, total_bits: int, levels: tuple[int, ...] = PACK_BITS) -> torch.Tensor:
    """weight [N] >= 0 -> widths [N] (int64, each in `levels`) with sum <= total_bits, minimising the
    summed `distortion`. Every channel starts at levels[0]; the upgrades to the next level are taken
    in order of distortion drop per added bit while they fit. For this convex distortion the drop
    per bit falls along each channel's levels, so the order never takes an upgrade before the one
    below it. Greedy: exact when every step costs one bit; the 4 -> 8 step costs four, so a few bits
    may stay unspent at the end. Deterministic: ties go to the lower channel index."""
    levels_t = torch.tensor(sorted(levels), dtype=torch.long)
    weight = weight.double().flatten().clamp(min=0)
    n = weight.numel()
    if total_bits < n * int(levels_t[0]):
        raise ValueError(f"{total_bits} bits cannot give {n} channels {int(levels_t[0])} bits each")
    low, high = levels_t[:-1], levels_t[1:]  # [U] upgrade steps
    cost = (high - low).repeat(n)  # [n * U], channel-major
    gain = (distortion(weight[:, None], low[None]) - distortion(weight[:, None], high[None])).flatten() / cost
    order = torch.argsort(-gain, stable=True)
    spent = n * int(levels_t[0])
    steps = torch.zeros(n, dtype=torch.long)
    for i in order.tolist():  # n * U cheap steps; stops early once nothing fits
        channel, step = divmod(i, len(low))
        if steps[channel] != step:  # the upgrade below it was skipped for its cost: so is this one
            continue
        if spent + int(cost[i]) <= total_bits:
            spent += int(cost[i])
            steps[channel] += 1
    return levels_t[steps]


def plan_string(widths: torch.Tensor) -> str:
    """widths [L, H, D] -> one digit per channel, C order."""
    return "".join(str(int(b)) for b in widths.flatten().tolist())


def check_widths(plan) -> None:
    """ValueError unless `plan` is a string of supported widths."""
    allowed = {str(b) for b in PACK_BITS}
    if not isinstance(plan, str) or not set(plan) <= allowed:
        raise ValueError(f"key plan widths must be among {sorted(allowed)}")


def parse_plan(plan: str, shape: tuple[int, int, int]) -> torch.Tensor:
    """The digits back to widths [L, H, D]; ValueError unless there is one supported width per channel."""
    count = shape[0] * shape[1] * shape[2]
    if len(plan) != count:
        raise ValueError(f"key plan has {len(plan)} widths, the KV has {count} channels {tuple(shape)}")
    check_widths(plan)
    return torch.tensor([int(c) for c in plan], dtype=torch.long).reshape(shape)
