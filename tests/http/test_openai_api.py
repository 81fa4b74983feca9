"""The OpenAI-compatible API with the real `openai` package (sync, async, streaming) on loopback."""

from __future__ import annotations

import asyncio

import httpx
import torch
from openai_helpers import DOCS, QUESTION, ragkv_of

from workers.prompt import SEPARATOR


def test_models_list(api):
    models = api.openai().models.list()
    assert [m.id for m in models.data] == ["default"] and models.data[0].owned_by == "ragkv"


def test_chat_with_documents_hits_every_chunk(api):
    with api.sdk() as sdk:
        sdk.ingest(DOCS)
    r = api.openai().chat.completions.create(model="default", messages=[{"role": "user", "content": QUESTION}],
                                             max_tokens=4, extra_body={"documents": DOCS})
    stats = ragkv_of(r)
    assert stats["chunks_hit"] == len(DOCS) and stats["chunks_computed"] == 0 and stats["mode"] == "blend"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.prompt_tokens == stats["prompt_tokens"] == len(stats["prompt_token_ids"])
    assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_documents_by_id_give_the_grpc_layout(api):
    """`documents` go before the question exactly as the gRPC layout puts chunks: same prompt ids."""
    with api.sdk() as sdk:
        refs = sdk.ingest(DOCS[:2])
        grpc = sdk.generate(QUESTION, chunks=[r.id for r in refs], max_new_tokens=3, mode="full")
    r = api.openai().chat.completions.create(
        model="default", messages=[{"role": "user", "content": QUESTION}], max_tokens=3,
        extra_body={"documents": [r.id for r in refs], "ragkv": {"mode": "full"}})
    assert ragkv_of(r)["prompt_token_ids"] == grpc.prompt_token_ids
    assert r.choices[0].message.content == grpc.text


def test_async_client(api):
    async def ask():
        async with api.async_openai() as client:
            return await client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": QUESTION}], max_tokens=3,
                extra_body={"documents": DOCS[:1]})

    r = asyncio.run(ask())
    assert r.choices[0].message.content and ragkv_of(r)["chunks_hit"] + ragkv_of(r)["chunks_computed"] == 1


def test_streamed_text_equals_non_streamed(api):
    client = api.openai()
    # full: a blend answer may change between two requests once the engine has computed the documents'
    # exact KV while idle (workers/sequences.py); the API must not change it
    kwargs = dict(model="default", messages=[{"role": "user", "content": QUESTION}], max_tokens=6,
                  extra_body={"documents": DOCS, "ragkv": {"mode": "full"}})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6  # include_usage: a last chunk
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stream_ends_with_done(api):
    body = {"model": "default", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{api.base_url}/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"


def test_greedy_full_equals_transformers_generate(api, runner):
    r = api.openai().chat.completions.create(
        model="default", messages=[{"role": "system", "content": "Answer briefly."},
                                   {"role": "user", "content": "\n\n".join(DOCS[:2]) + "\n\n" + QUESTION}],
        max_tokens=6, temperature=0, extra_body={"ragkv": {"mode": "full"}})
    ids = ragkv_of(r)["prompt_token_ids"]
    with torch.inference_mode():
        ref = runner.model.generate(torch.tensor(ids)[None], max_new_tokens=6, do_sample=False)[0, len(ids):]
    ref = [t for t in ref.tolist() if t not in runner.stop_token_ids]
    assert r.choices[0].message.content == runner.detokenize(ref)
    assert ragkv_of(r)["mode"] == "full" and ragkv_of(r)["recomputed_tokens"] == len(ids)


def test_multi_turn_renders_the_chat_template_and_keeps_the_system_prefix(api, runner):
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello."},
                {"role": "assistant", "content": "Hi."}, {"role": "user", "content": QUESTION}]
    r = api.openai().chat.completions.create(model="default", messages=messages, max_tokens=2,
                                             extra_body={"documents": DOCS[:1]})
    stats = ragkv_of(r)
    expected = list(messages)
    expected[-1] = {"role": "user", "content": DOCS[0] + SEPARATOR + QUESTION}
    text = runner.tokenizer.apply_chat_template(expected, tokenize=False, add_generation_prompt=True)
    assert runner.tokenizer.decode(stats["prompt_token_ids"]) == text
    assert stats["chunks_hit"] == 1 and stats["mode"] == "blend"
    one_turn = api.openai().chat.completions.create(
        model="default", messages=[messages[0], messages[-1]], max_tokens=1, extra_body={"documents": DOCS[:1]})
    prefix = runner.tokenize(text.split("Hello.")[0])  # the template up to the first user content
    assert ragkv_of(one_turn)["prompt_token_ids"][: len(prefix)] == stats["prompt_token_ids"][: len(prefix)]


def test_no_chunk_runs_prefix(api):
    r = api.openai().chat.completions.create(model="default", messages=[{"role": "user", "content": "Say hi."}],
                                             max_tokens=2)
    assert ragkv_of(r)["mode"] == "prefix" and ragkv_of(r)["chunks_hit"] == 0


def test_completions_plain_prompt(api, runner):
    r = api.openai().completions.create(model="default", prompt="The capital of France is", max_tokens=3)
    stats = ragkv_of(r)
    assert r.object == "text_completion" and r.choices[0].text and stats["mode"] == "full"
    assert stats["prompt_token_ids"] == runner.tokenize("The capital of France is")
    assert r.usage.completion_tokens == 3 and r.usage.prompt_tokens == len(stats["prompt_token_ids"])
    streamed = "".join(c.choices[0].text for c in api.openai().completions.create(
        model="default", prompt="The capital of France is", max_tokens=3, stream=True))
    assert streamed == r.choices[0].text


def test_stop_string_cuts_the_answer(api):
    client = api.openai()
    kwargs = dict(model="default", messages=[{"role": "user", "content": QUESTION}], max_tokens=6,
                  extra_body={"documents": DOCS[:1], "ragkv": {"mode": "full"}})
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    stop = whole[2:4]
    cut = client.chat.completions.create(stop=[stop], **kwargs)
    assert cut.choices[0].message.content == whole[: whole.find(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        stop=stop, stream=True, **kwargs) if c.choices)
    assert streamed == cut.choices[0].message.content


def test_health_metrics_and_request_id(api):
    assert httpx.get(f"{api.root}/health").json() == {"status": "ok"}
    r = httpx.get(f"{api.base_url}/models", headers={"x-request-id": "abc123"})
    assert r.headers["x-request-id"] == "abc123"
    metrics = httpx.get(f"{api.root}/metrics").text
    assert 'ragkv_requests_total{code="200",method="ChatCompletions",mode=""}' in metrics
    assert "ragkv_ttft_seconds_bucket" in metrics and 'ragkv_chunks_total{outcome="hit"}' in metrics
