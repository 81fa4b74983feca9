"""Validated request bodies -> the engine's GenerateRequest (a ChatPrompt inside); results -> OpenAI objects."""

from __future__ import annotations

import math
import time
import uuid

from ragkv.server.openai.errors import ApiError, bad_request
from ragkv.server.openai.schemas import MAX_STOP, ChatCompletionBody, CompletionBody, RagkvOptions, Sampling
from workers.requests import ChatMessage, ChatPrompt, CompressionSpec, GenerateRequest, GenerateResult

DEFAULT_MAX_TOKENS = 256  # chat completions without max_tokens
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_SEED = 2 ** 63 - 1
STAT_FIELDS = ("chunks_hit", "chunks_computed", "recomputed_tokens", "kv_bytes_loaded")


def check_model(model: str, served: tuple[str, ...]) -> None:
    if model not in served:
        raise ApiError(404, f"model: unknown model {model[:200]!r}; this server serves {', '.join(served)}",
                       "model", "model_not_found")


def _settings(body: Sampling, max_tokens: int | None) -> dict:
    if body.n not in (None, 1):
        raise bad_request("n", f"only n = 1 is supported, got {body.n}")
    stops = body.stops()
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise bad_request("stop", f"at most {MAX_STOP} non-empty stop strings")
    if body.seed is not None and not 0 <= body.seed <= MAX_SEED:
        raise bad_request("seed", f"must be in [0, {MAX_SEED}], got {body.seed}")
    kwargs: dict = {"max_new_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens}
    for name in ("temperature", "top_p"):
        if getattr(body, name) is not None:
            kwargs[name] = _finite(name, getattr(body, name))
    if body.seed is not None:
        kwargs["seed"] = body.seed
    return {**kwargs, **_extension(body.ragkv or RagkvOptions())}


def _finite(name: str, value: int | float) -> float:
    """A JSON number as a finite float (an int past float's range, inf or nan is a 400 naming `name`)."""
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise bad_request(name, f"must be a finite number, got {str(value)[:40]}")
    return number


def _extension(opts: RagkvOptions) -> dict:
    kwargs: dict = {"namespace": opts.namespace}
    if opts.mode is not None:
        kwargs["mode"] = opts.mode
    if opts.recompute_ratio is not None:
        kwargs["recompute_ratio"] = _finite("ragkv.recompute_ratio", opts.recompute_ratio)
    if opts.compression is not None:
        spec = {k: v for k, v in opts.compression.model_dump().items() if v is not None}
        kwargs["compression"] = CompressionSpec(**spec)
    return kwargs


def chat_request(body: ChatCompletionBody) -> GenerateRequest:
    messages = tuple(ChatMessage("system" if m.role == "developer" else m.role, m.text()) for m in body.messages)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    prompt = ChatPrompt(messages, tuple(body.documents or ()), discover=(body.ragkv or RagkvOptions()).discover)
    return GenerateRequest(question="", chunks=(), chat=prompt, **_settings(body, max_tokens))


def completion_request(body: CompletionBody) -> GenerateRequest:
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise bad_request("prompt", f"exactly one prompt per request, got {len(prompt)}")
        prompt = prompt[0]
    if not prompt:
        raise bad_request("prompt", "must not be empty")
    chat = ChatPrompt((ChatMessage("user", prompt),), tuple(body.documents or ()), template=False,
                      discover=(body.ragkv or RagkvOptions()).discover)
    max_tokens = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    return GenerateRequest(question="", chunks=(), chat=chat, **_settings(body, max_tokens))


# -- responses ----------------------------------------------------------------------------
def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:24]}"


def usage(result: GenerateResult) -> dict:
    prompt, completion = len(result.prompt_token_ids), len(result.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def ragkv_stats(result: GenerateResult) -> dict:
    """The extension object: what the request's prefill did, and the prompt it ran on."""
    stats = result.stats or {}
    out = {name: int(stats.get(name, 0) or 0) for name in STAT_FIELDS}
    out.update(prompt_tokens=len(result.prompt_token_ids), ttft_s=float(result.ttft_s),
               total_s=float(result.total_s), mode=str(stats.get("mode", "")),
               prompt_token_ids=[int(t) for t in result.prompt_token_ids])
    return out


def finish_reason(result: GenerateResult, max_tokens: int, stopped: bool) -> str:
    return "stop" if stopped or len(result.token_ids) < max_tokens else "length"


class Envelope:
    """The fields every object of one answer shares: id, created, model, and chat or text completion."""

    def __init__(self, model: str, chat: bool):
        self.chat, self.model = chat, model
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _base(self, suffix: str = "") -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind + suffix, "created": self.created, "model": self.model}

    def choice(self, text: str | None, finish: str | None, delta: bool = False, role: bool = False) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        content = {"role": "assistant"} if role or not delta else {}
        if text is not None:
            content["content"] = text
        return {"index": 0, ("delta" if delta else "message"): content, "logprobs": None, "finish_reason": finish}

    def answer(self, text: str, result: GenerateResult, finish: str) -> dict:
        return {**self._base(), "choices": [self.choice(text, finish)], "usage": usage(result),
                "ragkv": ragkv_stats(result)}

    def chunk(self, choices: list[dict], **extra) -> dict:
        return {**self._base(".chunk" if self.chat else ""), "choices": choices, **extra}
