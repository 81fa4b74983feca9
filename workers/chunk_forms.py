"""How a chunk's stored KV is computed, registered by name: `alone` or after a fixed `lead` in.

    alone   the chunk on its own at positions 0..n-1 (CacheBlend's stored form). Its first token
            becomes an attention sink: every later token of the chunk pours attention into it,
            and a prompt fused from N such chunks shows the question N spurious sinks.
    lead    the chunk computed after a fixed lead-in, the model's own chat-template prefix with
            its default system prompt (APE's shared prefix, Yang et al., ICLR 2025). The chunk
            gets the sink of a real prompt's start instead; the lead-in's KV is dropped and the
            keys are moved back to positions 0..n-1, so the stored form and fusing are unchanged.
            A chunk that opens a prompt with the default system prompt is then exact.

The default, `lead`, was chosen on the quality suite's dev split (README, "Chunk forms"). The
form changes the bytes, so it is part of what a block is addressed by and verified against:
`chunk_fingerprint` extends the model fingerprint with it (the lead-in's token ids for `lead`),
and a block computed in another form is never read as this one.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import lru_cache
from typing import Callable, Sequence

from kvstore.kv import ChunkKV
from kvstore.registry import registrar
from workers.rope import rerotate_keys

DEFAULT_CHUNK_FORM = "lead"
CHUNK_FORMS: dict[str, Callable] = {}  # name -> compute(runner, token_ids) -> ChunkKV


chunk_form = registrar(CHUNK_FORMS, "chunk form")


def check_form(form: str) -> str:
    if form not in CHUNK_FORMS:
        raise ValueError(f"unknown chunk form {form!r}; expected one of {', '.join(CHUNK_FORMS)}")
    return form


def compute_chunk(runner, token_ids: list[int], form: str = DEFAULT_CHUNK_FORM) -> ChunkKV:
    """The chunk's KV as `form` stores it (keys at positions 0..n-1)."""
    return CHUNK_FORMS[check_form(form)](runner, list(token_ids))


@lru_cache(maxsize=8)
def lead_in_ids(tokenizer) -> tuple[int, ...]:
    """The lead-in: the model's chat-template prefix with its default system prompt."""
    from workers.prompt import template_parts

    return tuple(tokenizer(template_parts(tokenizer, "")[0], add_special_tokens=False)["input_ids"])


def chunk_fingerprint(fingerprint: str, tokenizer, form: str = DEFAULT_CHUNK_FORM) -> str:
    """The fingerprint chunk blocks of `form` are addressed and verified with (the model's for `alone`)."""
    if check_form(form) == "alone":
        return fingerprint
    lead = hashlib.sha256(repr(lead_in_ids(tokenizer)).encode()).hexdigest()[:16]
    return f"{fingerprint}+{form}-{lead}"


@chunk_form("alone")
def chunk_alone(runner, token_ids: list[int]) -> ChunkKV:
    return runner.chunk_kv(token_ids)


@chunk_form("lead")
def chunk_after_lead(runner, token_ids: list[int]) -> ChunkKV:
    return chunk_kv_after(runner, token_ids, lead_in_ids(runner.tokenizer))


def chunk_kv_after(runner, token_ids: list[int], lead_ids: Sequence[int]) -> ChunkKV:
    """KV of `token_ids` computed after `lead_ids`, lead-in dropped, keys at positions 0..n-1."""
    if not token_ids:
        raise ValueError("chunk has no tokens")
    lead = len(lead_ids)
    both = runner.chunk_kv(list(lead_ids) + list(token_ids))  # keys [L, H, lead + T, D]
    keys = rerotate_keys(both.keys[:, :, lead:], -lead, runner.inv_freq).to(runner.dtype)
    return replace(both, keys=keys, values=both.values[:, :, lead:].contiguous(), token_ids=list(token_ids))
