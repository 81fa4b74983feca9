"""Prompt layout: chat template around chunk_1 \\n\\n ... chunk_N \\n\\n question.

Every chunk is tokenized on its own, so a chunk's token ids (and its content
address) do not depend on its neighbours, and every mode runs on exactly the
same prompt_token_ids.
"""

from __future__ import annotations

from dataclasses import dataclass

_SENTINEL = "\x00RAGKV_USER_CONTENT\x00"
SEPARATOR = "\n\n"


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


def template_parts(tokenizer, system_prompt: str) -> tuple[str, str]:
    """Text of the chat template before and after the user content."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": _SENTINEL})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prefix, suffix = text.split(_SENTINEL)
    return prefix, suffix


def build_prompt(tokenizer, system_prompt: str, chunks: list[list[int]], question: str) -> PromptLayout:
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prefix_text, suffix_text = template_parts(tokenizer, system_prompt)
    token_ids = ids(prefix_text)
    prefix_len = len(token_ids)
    separator = ids(SEPARATOR)
    spans = []
    for chunk in chunks:
        spans.append((len(token_ids), len(token_ids) + len(chunk)))
        token_ids += chunk + separator
    suffix_start = spans[-1][1] if spans else prefix_len
    token_ids += ids(question) + ids(suffix_text)
    return PromptLayout(token_ids=token_ids, prefix_len=prefix_len, chunk_spans=spans, suffix_start=suffix_start)
