"""2,000+ malformed or hostile bodies (seeded): every one is a 4xx in OpenAI's shape, none reaches the
model; streams cut short by the client; afterwards a good request is answered and nothing stored changed."""

from __future__ import annotations

import json
import random
import time

import httpx
from openai_helpers import DOCS, QUESTION, ragkv_of, settled, stored

BODIES = 2400
GOOD = {"model": "default", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 1,
        "documents": DOCS[:1], "ragkv": {"mode": "blend"}}
HOSTILE_VALUES = [None, True, -1, 0, 10 ** 30, -(10 ** 30), 1.5e308, float("inf"), float("nan"), "", "x" * 300,
                  "\x00", "\ud800", [], {}, [[[[]]]], {"a": {"b": {"c": None}}}, "0" * 64, "f" * 64]
FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
          "stream", "stream_options", "n", "documents", "ragkv"]


def _breaks(body: dict, rng: random.Random) -> bytes:
    """One invalid body: a field of the wrong type or range, a broken message, or broken bytes."""
    kind = rng.randrange(9)
    if kind == 0:  # a wrong value in a standard field
        body[rng.choice(FIELDS)] = rng.choice(HOSTILE_VALUES[:16])
        body["model"] = body["model"] if rng.random() < 0.5 else rng.choice(HOSTILE_VALUES)
        body["n"] = 2  # whatever else holds, this one is refused
    elif kind == 1:  # a broken message
        message = rng.choice([{"role": rng.choice(HOSTILE_VALUES)}, {"content": "x"}, {"role": "user", "content": 7},
                              {"role": "user", "content": [{"type": "image", "url": "x"}]}, "user", None])
        body["messages"] = [message] * rng.randrange(1, 4)
    elif kind == 2:  # deep nesting inside a field
        depth = rng.choice([50, 500, 5000])
        body[rng.choice(FIELDS)] = json.loads("[" * depth + "]" * depth) if depth < 900 else None
        body["n"] = 0
        if depth >= 900:
            return (b'{"model": "default", "messages": ' + b"[" * depth + b"]" * depth + b"}")
    elif kind == 3:  # huge numbers and unknown fields
        body[f"unknown_{rng.randrange(10 ** 6)}"] = rng.choice(HOSTILE_VALUES)
        body[rng.choice(["max_tokens", "seed", "temperature", "top_p"])] = rng.choice(
            [10 ** rng.randrange(20, 400), -(10 ** 20), 1e308, -1])
    elif kind == 4:  # extension objects gone wrong
        body["ragkv"] = rng.choice([{"mode": rng.choice(["", "FULL", "blend "])}, {"recompute_ratio": -0.1},
                                    {"namespace": "\x07"}, {"compression": {"policy": "h2o", "budget": 0}},
                                    {"unknown": True}, "blend", [1]])
    elif kind == 5:  # bad documents
        body["documents"] = rng.choice([[""], ["   "], [7], "doc", [None], ["x" * 40_000]] + [["0" * 63 + "g"] * 65])
    elif kind == 6:  # invalid UTF-8 or raw garbage
        raw = json.dumps(body).encode()
        cut = rng.randrange(len(raw))
        return raw[:cut] + bytes([rng.randrange(0x80, 0x100)]) + raw[cut:]
    elif kind == 7:  # truncated JSON
        raw = json.dumps(body).encode()
        return raw[: rng.randrange(len(raw) - 1)]
    else:  # not an object at all
        return rng.choice([b"null", b"42", b'"text"', b"[]", b"true", bytes(rng.randrange(256) for _ in range(64))])
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


def test_hostile_bodies_are_refused_and_the_server_keeps_answering(api):
    with api.sdk() as sdk:
        sdk.ingest(DOCS[:1])
    _good(api)  # the prefix block is stored by the first good request: before the snapshot
    before = settled(api.engine)  # the engine's idle-time work for that request (sequence nodes) done
    requests_before = api.engine.stats().engine.requests
    rng = random.Random(50)
    statuses: dict[int, int] = {}
    url = f"{api.base_url}/chat/completions"
    started = time.perf_counter()
    with httpx.Client(timeout=60) as http:
        for _ in range(BODIES):
            body = json.loads(json.dumps(GOOD))
            r = http.post(url, content=_breaks(body, rng), headers={"Content-Type": "application/json"})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code in (400, 404), r.text[:300]
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in r.text
    print(f"{BODIES} bodies in {time.perf_counter() - started:.1f} s: {statuses}")
    assert statuses[400] > BODIES // 2
    assert api.engine.stats().engine.requests == requests_before  # none reached the model
    assert stored(api.engine) == before

    for cut in (0, 1, 3):  # streams the client stops reading after `cut` events
        with httpx.stream("POST", url, json={**GOOD, "max_tokens": 4, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            for i, _ in enumerate(r.iter_lines()):
                if i >= cut:
                    break
    assert ragkv_of(_good(api))["chunks_hit"] == 1
    after = stored(api.engine)
    chunk = api.engine.store.address_for(api.engine.tokenize_chunk(DOCS[0], "doc"))
    assert after["blocks"][chunk] == before["blocks"][chunk] and after["index"] == before["index"]


def _good(api):
    good = api.openai().chat.completions.create(**{k: v for k, v in GOOD.items() if k not in ("documents", "ragkv")},
                                                extra_body={"documents": DOCS[:1]})
    assert good.choices[0].message.content is not None
    return good
