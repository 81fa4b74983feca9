"""An OpenAI-style request (GenerateRequest.chat) -> its prompt layout: turns of pieces (workers/prompt.py).

Each user message is split into pieces: text (computed) and the ingested chunks it pastes, found by
exact text (workers/discovery.py); the request's `documents` go first in the last user message, as
chunks, like the gRPC layout's. Every piece that is a chunk is tokenized on its own, so its token
ids and content address are the ones ingest stored. A prompt with no chunk pieces runs `prefix` in
place of a chunk mode (nothing to reuse but the system prompt); a prompt without a template prefix
(a plain completion) runs `full`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from kvstore.text_index import TextIndex
from workers.discovery import Found, discover
from workers.prompt import PromptLayout, Turn, build_turns_prompt
from workers.requests import GenerateRequest, is_chunk_id

# (chunk id, index in `documents`) -> (token ids, the compression it was ingested with)
ResolveId = Callable[[str, int], tuple[list[int], "dict | None"]]
Tokenize = Callable[[str, str], list[int]]  # (chunk text, field name) -> token ids; InvalidArgument names the field
EXACT_MODES = ("full", "prefix")  # modes that need no chunk piece


def chat_layout(tokenizer, request: GenerateRequest, resolve_id: ResolveId, tokenize: Tokenize,
                index: TextIndex | None) -> tuple[GenerateRequest, PromptLayout, list[dict | None]]:
    """-> (the request with the mode that runs, its layout, per chunk span the compression it was stored with)."""
    chat = request.chat
    last_user = max(i for i, m in enumerate(chat.messages) if m.role == "user")
    turns, compressions = [], []
    for i, message in enumerate(chat.messages):
        if message.role != "user":
            turns.append(Turn(message.role, (message.content,)))
            continue
        pieces: list = []
        if i == last_user:
            for d, doc in enumerate(chat.documents):
                ids, compression = resolve_id(doc, d) if is_chunk_id(doc) else (tokenize(doc, f"documents[{d}]"), None)
                pieces.append(ids)
                compressions.append(compression)
        found = discover(message.content, index, request.namespace) if chat.discover and index else [message.content]
        if found == [""] and pieces:
            found = []  # an empty message after documents adds no separator
        for piece in found:
            if isinstance(piece, Found):
                pieces.append(tokenize(piece.text, f"messages[{i}].content"))
                compressions.append(piece.chunk.compression)
            else:
                pieces.append(piece)
        turns.append(Turn("user", tuple(pieces)))
    layout = build_turns_prompt(tokenizer, turns, template=chat.template)
    return replace(request, mode=running_mode(request.mode, layout)), layout, compressions


def running_mode(mode: str, layout: PromptLayout) -> str:
    if layout.prefix_len == 0:
        return "full"  # no template prefix: nothing stored can lead the prompt
    if not layout.chunk_spans and mode not in EXACT_MODES:
        return "prefix"
    return mode
