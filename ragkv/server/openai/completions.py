"""Answering one completion, chat or plain, whole or streamed as server-sent events.

Stop strings are applied here, on the text: the answer ends before the first one (the engine decodes
on to max_tokens or EOS, so usage and the `ragkv` stats stay those of the request that ran). A stream
holds back the last few characters that could begin a stop string.
"""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator

from fastapi.responses import JSONResponse, StreamingResponse

from ragkv.errors import RagKVServerError
from ragkv.server.openai.convert import Envelope, finish_reason, ragkv_stats, usage
from ragkv.server.openai.errors import ApiError, from_domain
from ragkv.server.openai.gateway import Gateway, Stream
from workers.requests import GenerateRequest, GenerateResult

log = logging.getLogger("ragkv.server")

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """(text before the first stop string, whether one was found)."""
    ends = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(ends)], True) if ends else (text, False)


async def answer(gateway: Gateway, request: GenerateRequest, envelope: Envelope, stops: list[str],
                 headers: dict) -> JSONResponse:
    result = await gateway.generate(request)
    text, stopped = cut_at_stop(result.text, stops)
    return JSONResponse(envelope.answer(text, result, finish_reason(result, request.max_new_tokens, stopped)),
                        headers=headers)


async def stream(gateway: Gateway, request: GenerateRequest, envelope: Envelope, stops: list[str],
                 include_usage: bool, headers: dict) -> StreamingResponse:
    """Waits for the first item, so an error before any token is an HTTP status, then streams."""
    source = gateway.stream(request)
    items = source.__aiter__()
    try:
        first = await items.__anext__()
    except BaseException:
        source.stop()
        raise
    events = _events(source, items, first, request, envelope, stops, include_usage)
    return StreamingResponse(events, media_type="text/event-stream", headers={**SSE_HEADERS, **headers})


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _events(source: Stream, items: AsyncIterator, first, request: GenerateRequest, envelope: Envelope,
                  stops: list[str], include_usage: bool) -> AsyncIterator[bytes]:
    extra = {"usage": None} if include_usage else {}
    hold = max((len(s) for s in stops), default=1) - 1  # characters that may begin a stop string
    text, sent, stopped, result = "", 0, False, None
    try:
        if envelope.chat:
            yield _sse(envelope.chunk([envelope.choice("", None, delta=True, role=True)], **extra))
        pending = [first]
        while result is None:
            item = pending.pop() if pending else await items.__anext__()
            if isinstance(item, GenerateResult):
                result = item
                break
            if stopped:
                continue
            text += item
            text, stopped = cut_at_stop(text, stops) if stops else (text, False)
            upto = len(text) if stopped else len(text) - hold
            if upto > sent:
                yield _sse(envelope.chunk([envelope.choice(text[sent:upto], None, delta=True)], **extra))
                sent = upto
        if len(text) > sent:
            yield _sse(envelope.chunk([envelope.choice(text[sent:], None, delta=True)], **extra))
        finish = finish_reason(result, request.max_new_tokens, stopped)
        yield _sse(envelope.chunk([envelope.choice(None, finish, delta=True)], ragkv=ragkv_stats(result), **extra))
        if include_usage:
            yield _sse(envelope.chunk([], usage=usage(result), ragkv=ragkv_stats(result)))
        yield DONE
    except RagKVServerError as e:  # after the first token: the status is sent, the error goes in the stream
        yield _sse(from_domain(e).body())
    except ApiError as e:
        yield _sse(e.body())
    except Exception as e:  # logged with its traceback; the client sees a generic error, never the trace
        log.error("unexpected error in a stream", exc_info=e)
        yield _sse(ApiError(500, "internal error", None, "internal_error").body())
    finally:
        source.stop()  # a client that went away frees its place in the batch
