"""Request bodies (pydantic, strict: "5" is not a number) for /v1/chat/completions and /v1/completions.

Standard OpenAI fields, plus the extensions `documents` (chunk texts or stored chunk ids) and `ragkv`
(mode, recompute_ratio, namespace, compression). Fields OpenAI defines that change nothing here
(user, presence_penalty, ...) are accepted and ignored, as other OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Number = Union[StrictInt, StrictFloat]
MAX_STOP = 4  # OpenAI's limit


class Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # our own objects: a misspelt key is an error


class TextPart(Strict):
    type: Literal["text"]
    text: StrictStr


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[StrictStr, list[TextPart], None] = None
    name: StrictStr | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(Strict):
    include_usage: StrictBool = False


class CompressionOptions(Closed):
    policy: StrictStr = "none"
    budget: Number = 1.0
    sink_tokens: StrictInt | None = None
    protect_system_prompt: StrictBool | None = None
    window: StrictInt | None = None
    decode_budget: Number | None = None


class RagkvOptions(Closed):
    mode: StrictStr | None = None
    recompute_ratio: Number | None = None
    namespace: StrictStr = ""
    compression: CompressionOptions | None = None
    discover: StrictBool = True  # find ingested chunks pasted into user messages


class Sampling(Strict):
    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    seed: StrictInt | None = None
    stop: Union[StrictStr, list[StrictStr], None] = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    n: StrictInt | None = 1
    documents: list[StrictStr] | None = None
    ragkv: RagkvOptions | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionBody(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None


class CompletionBody(Sampling):
    prompt: Union[StrictStr, list[StrictStr]]
    echo: StrictBool = False
