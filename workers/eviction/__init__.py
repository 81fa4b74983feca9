"""Token-level KV eviction: policies (registry), protection, real removal, decode-time budget, L1 loss bound.

API for the engine:

    compressor = make_compressor(spec, shape, prefix_len, prompt_len,   # InvalidArgument on a bad budget
                                 question_start=layout.suffix_start)
    logits = runner.forward(ids, positions, cache, observer=compressor.observer)
    compressor.prepare(runner, cache, ids, (0, layout.suffix_start))     # kvzip's reconstruction pass
    stats = compressor.compress(cache)      # kv_bytes_before/after, evicted, l1_loss, l1_bound, ...
    hooks = compressor.decode_hooks()       # append (prefill presses) or stay at the decode budget
    compressor.stats()

`compress_chunk(runner, kv, spec)` (chunks.py) compresses one stored chunk on its own (ingest).

Pass `inv_freq=runner.inv_freq` (when `runner.can_rerotate`) so `streaming` can keep its
window on compact positions while generating far beyond the model's context.
"""

from __future__ import annotations

import torch

from workers.errors import InvalidArgument
from workers.eviction.budgets import count_protected
from workers.eviction import kvzip  # noqa: F401  (registers "kvzip")
from workers.eviction.compressor import Compressor
from workers.eviction.policies import POLICIES, Policy, ScoreContext, build_policy, register
from workers.requests import CompressionSpec

__all__ = ["Compressor", "POLICIES", "Policy", "ScoreContext", "build_policy", "make_compressor", "register"]


def make_compressor(spec: CompressionSpec, shape, prefix_len: int, prompt_len: int,
                    inv_freq: torch.Tensor | None = None, scale: float | None = None,
                    question_start: int | None = None, ingest: bool = False) -> Compressor:
    """A Compressor for one request. shape: workers.runner.ModelShape.

    The budget (spec.budget_tokens(prompt_len)) counts the protected tokens: the first
    `sink_tokens`, the prompt prefix (template + system message) when `protect_system_prompt`,
    and `protected_spans`; a budget below that set raises InvalidArgument("compression.budget"),
    a decode budget below it InvalidArgument("compression.decode_budget").
    question_start: first position of the question (PromptLayout.suffix_start): windowed policies
    (SnapKV and its wrappers) observe at least the tokens from there on.
    ingest: a chunk compressed alone (its per-head result stays padded: chunks.to_chunk stores that).
    """
    budget = spec.budget_tokens(prompt_len)
    prefix = prefix_len if spec.protect_system_prompt else 0
    for start, end in spec.protected_spans:
        if not 0 <= start <= end:
            raise InvalidArgument("compression.protected_spans", f"bad span [{start}, {end})")
    protected = count_protected(prompt_len, spec.sink_tokens, prefix, spec.protected_spans)
    if spec.policy != "none" and budget < protected:
        raise InvalidArgument("compression.budget",
                              f"budget of {budget} tokens is below the {protected} protected tokens "
                              f"(sinks={spec.sink_tokens}, system prompt prefix={prefix}, "
                              f"spans={len(spec.protected_spans)})")
    decode_budget = spec.decode_budget_tokens(prompt_len)
    if spec.policy != "none" and decode_budget is not None and decode_budget < protected:
        raise InvalidArgument("compression.decode_budget",
                              f"decode budget of {decode_budget} tokens is below the {protected} protected tokens")
    policy = None if spec.policy == "none" else build_policy(spec)
    question = prompt_len - question_start if question_start is not None else 0
    return Compressor(policy, spec, shape.num_layers, shape.head_dim, prefix_len, prompt_len, budget,
                      inv_freq=inv_freq, scale=scale, decode_budget=decode_budget, question_tokens=question,
                      pack=not ingest)
