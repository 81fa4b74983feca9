"""Prompt layout: chat template around chunk_1 \\n\\n ... chunk_N \\n\\n question.

Every chunk is tokenized on its own, so a chunk's token ids (and its content
address) do not depend on its neighbours, and every mode runs on exactly the
same prompt_token_ids.

A model without a chat template (a base model: Gemma 3 270M) is given `PLAIN_TEMPLATE` when it loads:
system text, the user content (chunks, then the question), then "Answer:". `ragkv serve --prompt-template
FILE` replaces the model's template with another (Jinja, as transformers renders chat templates); every
mode renders the same one.

The general form (`build_turns_prompt`, used by the OpenAI-compatible API) is a conversation whose
user messages are sequences of pieces joined by "\\n\\n": a piece is text (tokenized on its own,
computed) or a stored chunk's token ids (served from the store). The gRPC layout is the one-turn
case: [system], user = [chunk_1, ..., chunk_N, question].
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence, Union

_SENTINEL = "\x00RAGKV_USER_CONTENT\x00"
_TURN_SENTINEL = "\x00RAGKV_USER_{}\x00"
_TURN_RE = re.compile("\x00RAGKV_USER_[0-9]+\x00")
SEPARATOR = "\n\n"
PLAIN_TEMPLATE = (  # documents-then-question for models without a chat template
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content }}\n\n"
    "{% elif m.role == 'user' %}{{ m.content }}\n"
    "{% else %}Answer: {{ m.content }}\n\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Answer:{% endif %}")

Piece = Union[str, Sequence[int]]  # text (computed) or a stored chunk's token ids


@dataclass(frozen=True)
class PromptLayout:
    token_ids: list[int]
    prefix_len: int  # template + system message + user header: an exact prefix, same for every request
    chunk_spans: list[tuple[int, int]]  # [start, end) of each chunk in token_ids
    suffix_start: int  # first token after the last chunk (separator, question, template, generation prompt)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prefix_ids(self) -> list[int]:
        return self.token_ids[: self.prefix_len]

    @property
    def suffix_ids(self) -> list[int]:
        return self.token_ids[self.suffix_start:]


@dataclass(frozen=True)
class Turn:
    """One message: a user message's content is pieces; any other role's is text the template renders."""
    role: str
    pieces: tuple[Piece, ...]


def template_file(path: str) -> str:
    """A Jinja chat template file's text (`--prompt-template`); ValueError naming the file when it cannot be
    read or is empty."""
    try:
        text = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not text.strip():
        raise ValueError(f"{path} is empty")
    return text


def use_template(tokenizer, template: str | None = None) -> None:
    """Give the tokenizer `template` (Jinja), or PLAIN_TEMPLATE when it has none of its own."""
    if template:
        tokenizer.chat_template = template
    elif not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_TEMPLATE


def template_parts(tokenizer, system_prompt: str) -> tuple[str, str]:
    """Text of the chat template before and after the user content."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": _SENTINEL})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prefix, suffix = text.split(_SENTINEL)
    return prefix, suffix


def build_prompt(tokenizer, system_prompt: str, chunks: list[list[int]], question: str) -> PromptLayout:
    turns = [Turn("system", (system_prompt,))] if system_prompt else []
    turns.append(Turn("user", (*chunks, question)))
    return build_turns_prompt(tokenizer, turns)


def template_texts(tokenizer, turns: Sequence[Turn]) -> list[str]:
    """The chat template's text around the user messages' contents: [before the first, between, ..., after
    the last] (one more than there are user messages)."""
    messages, users = [], 0
    for turn in turns:
        if turn.role == "user":
            messages.append({"role": "user", "content": _TURN_SENTINEL.format(users)})
            users += 1
        else:
            messages.append({"role": turn.role, "content": "".join(p for p in turn.pieces if isinstance(p, str))})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    parts = _TURN_RE.split(text)
    if len(parts) != users + 1:
        raise ValueError(f"the chat template rendered {len(parts) - 1} of {users} user messages")
    return parts


def build_turns_prompt(tokenizer, turns: Sequence[Turn], template: bool = True) -> PromptLayout:
    """The layout of a conversation. The exact prefix (`prefix_len`) is the template up to the FIRST user
    content, so it stays one block per system prompt however long the conversation; earlier turns are
    computed text; every chunk piece of any user message is a chunk span. `template=False`: one user
    turn, no template (a plain completion prompt; prefix_len 0)."""
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    users = [t for t in turns if t.role == "user"]
    texts = template_texts(tokenizer, turns) if template else ["", ""]
    token_ids = ids(texts[0])
    prefix_len = len(token_ids)
    separator = ids(SEPARATOR)
    spans = []
    for turn, after in zip(users, texts[1:]):
        for i, piece in enumerate(turn.pieces):
            if i:
                token_ids += separator
            if isinstance(piece, str):
                token_ids += ids(piece)
            else:
                spans.append((len(token_ids), len(token_ids) + len(piece)))
                token_ids += list(piece)
        token_ids += ids(after)
    suffix_start = spans[-1][1] if spans else prefix_len
    return PromptLayout(token_ids=token_ids, prefix_len=prefix_len, chunk_spans=spans, suffix_start=suffix_start)
