"""How far a changed cache (blended, compressed) drifts from the full one, over a reference answer:
teacher-forced logits at every answer step, and the KL divergence of next-token distributions."""

from __future__ import annotations

import torch

from workers.cache import KVCache


def kl_rows(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row. [M, V] logits -> [M]."""
    logp, logq = torch.log_softmax(p_logits.float(), -1), torch.log_softmax(q_logits.float(), -1)
    return (logp.exp() * (logp - logq)).sum(-1)


@torch.inference_mode()
def teacher_forced(runner, cache: KVCache, tokens: list[int], start: int) -> torch.Tensor:
    """Logits predicting tokens[1:] given tokens[:-1] fed at positions start.. -> [len(tokens) - 1, V]."""
    ids = torch.tensor(tokens[:-1], device=runner.device)
    return runner.forward(ids, torch.arange(start, start + len(ids), device=runner.device), cache, last_only=False)
