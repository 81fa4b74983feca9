"""Every error in OpenAI's shape, with its status; nothing stored changes."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai_helpers import QUESTION, TOKEN, settled, stored

GOOD = {"model": "default", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 1}


def _post(url: str, body=None, content: bytes | None = None, headers: dict | None = None) -> httpx.Response:
    return httpx.post(url, json=body, content=content, headers=headers, timeout=120)


def _error(r: httpx.Response) -> dict:
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize("change, param", [
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 10 ** 9}, "max_tokens"),
    ({"temperature": 11}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 2}, "n"),
    ({"seed": -1}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "messages"),
    ({"documents": [""]}, "documents[0]"),
    ({"documents": "not a list"}, "documents"),
    ({"ragkv": {"mode": "nope"}}, "ragkv.mode"),
    ({"ragkv": {"recompute_ratio": 2}}, "ragkv.recompute_ratio"),
    ({"ragkv": {"namespace": "a\x01b"}}, "ragkv.namespace"),
    ({"ragkv": {"compression": {"policy": "nope"}}}, "ragkv.compression.policy"),
    ({"ragkv": {"typo": 1}}, "ragkv.typo"),
    ({"model": None}, "model"),
])
def test_bad_argument_is_400_naming_the_field(api, change, param):
    r = _post(f"{api.base_url}/chat/completions", {**GOOD, **change})
    assert r.status_code == 400, r.text
    error = _error(r)
    assert error["param"] == param and param in error["message"] and error["type"] == "invalid_request_error"


def test_openai_client_raises_bad_request_with_param(api):
    with pytest.raises(openai.BadRequestError) as e:
        api.openai().chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], n=3)
    assert e.value.status_code == 400 and e.value.param == "n"


def test_unknown_model_and_chunk_id_are_404(api):
    r = _post(f"{api.base_url}/chat/completions", {**GOOD, "model": "gpt-4o"})
    assert r.status_code == 404 and _error(r)["param"] == "model" and _error(r)["code"] == "model_not_found"
    r = _post(f"{api.base_url}/chat/completions", {**GOOD, "documents": ["f" * 64]})
    assert r.status_code == 404 and _error(r)["param"] == "documents[0]"
    with pytest.raises(openai.NotFoundError):
        api.openai().chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    r = httpx.get(f"{api.root}/v1/nothing-here")
    assert r.status_code == 404 and _error(r)["type"] == "not_found_error"


def test_malformed_and_oversized_bodies_are_400_and_change_nothing(api, guarded):
    http, _ = guarded
    before = settled(api.engine)  # earlier tests' idle-time work (sequence nodes) done: it is not this test's
    url = f"http://127.0.0.1:{http.port}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for content in (b"{", b"[1, 2]", b'{"model": "default", "messages": [}', b"\xff\xfe\xfd", b"[" * 50_000,
                    b'{"model":"default","messages":[{"role":"user","content":"\\ud800"}]}'):
        r = _post(url, content=content, headers=auth)
        assert r.status_code == 400 and _error(r)["code"] == "invalid_json", (content[:40], r.text)
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * (65 << 10)}]}
    r = _post(url, big, headers=auth)
    assert r.status_code == 400 and _error(r)["code"] == "body_too_large"
    assert stored(api.engine) == before


def test_token_required_when_set(guarded):
    http, _ = guarded
    url = f"http://127.0.0.1:{http.port}/v1/models"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = httpx.get(url, headers=headers)
        assert r.status_code == 401 and _error(r)["type"] == "authentication_error"
    assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{http.port}/health").status_code == 200  # probes need no token
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http.port}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_full_queue_is_429(guarded):
    http, admission = guarded
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with admission.slot():  # the one slot is taken and the queue holds none
        r = _post(f"http://127.0.0.1:{http.port}/v1/chat/completions", GOOD, headers=headers)
        assert r.status_code == 429 and _error(r)["type"] == "rate_limit_error"
        r = _post(f"http://127.0.0.1:{http.port}/v1/chat/completions", {**GOOD, "stream": True}, headers=headers)
        assert r.status_code == 429


def test_draining_server_is_503_then_stops(api):
    from ragkv.server.openai.app import HttpSettings, start_http

    http = start_http("127.0.0.1", 0, api.running.engine, api.running.admission, api.running.metrics,
                      HttpSettings(models=("default",)))
    root = f"http://127.0.0.1:{http.port}"
    assert httpx.get(f"{root}/health").status_code == 200
    http.begin_drain()
    assert httpx.get(f"{root}/health").status_code == 503
    r = _post(f"{root}/v1/chat/completions", GOOD)
    assert r.status_code == 503 and _error(r)["code"] == "unavailable"
    http.stop(2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{root}/health", timeout=5)
