"""How a chunk's stored KV is computed, registered by name: what the chunk is computed after.

A form is the token ids a chunk is computed after; their KV is dropped and the chunk's keys are
moved back to positions 0..n-1, so the stored form and fusing are the same for every form.

    alone   nothing: the chunk on its own (CacheBlend's stored form). Its first token becomes an
            attention sink: every later token of the chunk pours attention into it, and a prompt
            fused from N such chunks shows the question N spurious sinks.
    lead    a fixed lead-in, the model's own chat-template prefix with its default system prompt
            (APE's shared prefix, Yang et al., ICLR 2025). The chunk gets the sink of a real
            prompt's start instead. A chunk that opens a prompt with the default system prompt is
            then exact.
    doc     the lead-in, then a bland earlier document and the separator: the chunk is computed
            as the second document of a prompt, which is where all but the first chunk of a RAG
            prompt sit (research/blend.md, "Chunk forms").

The default, `doc`, was chosen on the quality suite's dev split (research/blend.md, "Chunk forms"). The
form changes the bytes, so it is part of what a block is addressed by and verified against:
`chunk_fingerprint` extends the model fingerprint with it (a hash of the form's lead token ids),
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

DEFAULT_CHUNK_FORM = "doc"
# name -> lead(tokenizer) -> the token ids a chunk is computed after (their KV dropped); () = alone
CHUNK_FORMS: dict[str, Callable] = {}
# the `doc` form's earlier document: bland, no names or numbers a chunk could pick up
EARLIER_DOCUMENT = ("This archive collects short notes on everyday topics. The notes are written in plain language and "
                    "describe ordinary things such as weather, food, travel and work. Each note stands on its own.")


chunk_form = registrar(CHUNK_FORMS, "chunk form")


def check_form(form: str) -> str:
    if form not in CHUNK_FORMS:
        raise ValueError(f"unknown chunk form {form!r}; expected one of {', '.join(CHUNK_FORMS)}")
    return form


def form_lead(tokenizer, form: str = DEFAULT_CHUNK_FORM) -> tuple[int, ...]:
    """The token ids a chunk of `form` is computed after (empty for `alone`)."""
    return tuple(CHUNK_FORMS[check_form(form)](tokenizer))


def compute_chunk(runner, token_ids: list[int], form: str = DEFAULT_CHUNK_FORM) -> ChunkKV:
    """The chunk's KV as `form` stores it (keys at positions 0..n-1)."""
    lead = form_lead(runner.tokenizer, form)
    return chunk_kv_after(runner, list(token_ids), lead) if lead else runner.chunk_kv(list(token_ids))


@lru_cache(maxsize=8)
def lead_in_ids(tokenizer) -> tuple[int, ...]:
    """The lead-in: the model's chat-template prefix with its default system prompt."""
    from workers.prompt import template_parts

    return tuple(tokenizer(template_parts(tokenizer, "")[0], add_special_tokens=False)["input_ids"])


def chunk_fingerprint(fingerprint: str, tokenizer, form: str = DEFAULT_CHUNK_FORM) -> str:
    """The fingerprint chunk blocks of `form` are addressed and verified with (the model's for `alone`)."""
    lead = form_lead(tokenizer, form)
    if not lead:
        return fingerprint
    return f"{fingerprint}+{form}-{hashlib.sha256(repr(lead).encode()).hexdigest()[:16]}"


@chunk_form("alone")
def alone_lead(tokenizer) -> tuple[int, ...]:
    return ()


@chunk_form("lead")
def lead_lead(tokenizer) -> tuple[int, ...]:
    return lead_in_ids(tokenizer)


@chunk_form("doc")
@lru_cache(maxsize=8)
def doc_lead(tokenizer) -> tuple[int, ...]:
    from workers.prompt import SEPARATOR

    return lead_in_ids(tokenizer) + tuple(tokenizer(EARLIER_DOCUMENT + SEPARATOR, add_special_tokens=False)["input_ids"])


def chunk_kv_after(runner, token_ids: list[int], lead_ids: Sequence[int]) -> ChunkKV:
    """KV of `token_ids` computed after `lead_ids`, lead-in dropped, keys at positions 0..n-1."""
    if not token_ids:
        raise ValueError("chunk has no tokens")
    lead = len(lead_ids)
    both = runner.chunk_kv(list(lead_ids) + list(token_ids))  # keys [L, H, lead + T, D]
    keys = rerotate_keys(both.keys[:, :, lead:], -lead, runner.inv_freq).to(runner.dtype)
    return replace(both, keys=keys, values=both.values[:, :, lead:].contiguous(), token_ids=list(token_ids))
