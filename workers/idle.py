"""Model work done in short units while the scheduler is idle (Scheduler.defer): a generator yields
between units, so a request that arrives waits for at most one unit, never for a whole prefill."""

from __future__ import annotations

from typing import Iterator

import torch

from workers.cache import KVCache

LAYERS_PER_UNIT = 6


def prefill_units(runner, token_ids: list[int], cache: KVCache, out: list) -> Iterator[None]:
    """A full prefill of `token_ids` at positions 0.. into `cache`, LAYERS_PER_UNIT layers a unit; the last
    token's logits [1, vocab] are appended to `out` when done."""
    ids = torch.tensor(token_ids, device=runner.device)
    positions = torch.arange(len(token_ids), device=runner.device)
    with torch.inference_mode():
        hidden = runner.embed(ids)  # [S, hidden]
    for layer in range(runner.shape.num_layers):
        with torch.inference_mode():
            hidden = runner.layer_forward(layer, hidden, positions, cache)
        if layer % LAYERS_PER_UNIT == LAYERS_PER_UNIT - 1:
            yield
    with torch.inference_mode():
        out.append(runner.logits(hidden[-1:]))
