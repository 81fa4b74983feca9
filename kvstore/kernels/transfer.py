"""Host <-> device copies of codec payloads, through pinned (page-locked) buffers on CUDA.

Encoding on a GPU quantizes there (kvstore/kernels/dispatch.py) and only the packed
parts cross to the host: `to_host` copies them into one pinned staging buffer with
non-blocking copies and a single synchronize, then hands out host views. Decoding
moves a payload to the device once with `to_device` (pinned staging, non-blocking).
Host tensors pass through untouched, so on CPU both are no-ops; pinning is used only
when CUDA is available (`pinned_ok`), else plain copies.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def pinned_ok() -> bool:
    """Page-locked host memory is usable (a CUDA runtime is present)."""
    if not torch.cuda.is_available():
        return False
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError:
        return False
    return True


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def to_host(parts: list[torch.Tensor | None]) -> list[torch.Tensor]:
    """Payload parts (None dropped) -> contiguous host tensors, in order, same dtypes and shapes.

    Device parts go through one pinned buffer: one non-blocking copy each, one synchronize."""
    parts = [p.contiguous() for p in parts if p is not None]
    on_device = [p for p in parts if p.device.type != "cpu"]
    if not on_device:
        return parts
    total = sum(_nbytes(p) for p in on_device)
    staging = torch.empty(total, dtype=torch.uint8, pin_memory=pinned_ok())  # [total] bytes
    out, offset = [], 0
    for p in parts:
        if p.device.type == "cpu":
            out.append(p)
            continue
        n = _nbytes(p)
        view = staging[offset:offset + n]
        view.copy_(p.reshape(-1).view(torch.uint8), non_blocking=True)
        out.append(view.view(p.dtype).reshape(p.shape) if n else torch.empty(p.shape, dtype=p.dtype))
        offset += n
    for device in {p.device for p in on_device}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return out


def to_device(buf: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host byte buffer [N] uint8 -> the same bytes on `device` (pinned staging on CUDA)."""
    device = torch.device(device)
    if device.type == "cpu":
        return buf
    if device.type == "cuda" and pinned_ok():
        buf = buf.pin_memory()
        return buf.to(device, non_blocking=True)
    return buf.to(device)
