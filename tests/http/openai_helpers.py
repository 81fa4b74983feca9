"""What the HTTP tests share: the running servers, clients, a snapshot of everything stored."""

from __future__ import annotations

import time
from dataclasses import dataclass

import openai

from client import RagKVClient

# the guarded server's token; here, not in conftest.py: a bare `from conftest import` finds whichever test
# folder's conftest module was imported first when tests/http and tests/server run in one session
TOKEN = "http-s3cret"

DOCS = [
    "The capital of Frobnia is Lindorf. Lindorf was founded in 1432 by the salt merchant Osric Vale.",
    "Zorblat is a cold planet with two moons, Tiv and Rel, and oceans of liquid methane.",
    "Brightwell Robotics makes greenhouse robots; its chief executive is Lorna Featherstone.",
]
QUESTION = "Who founded Lindorf?"


@dataclass
class Api:
    engine: object
    running: object  # ragkv.server.app.RunningServer
    http: object  # ragkv.server.openai.app.RunningHttp

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http.port}/v1"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.http.port}"

    def openai(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=kwargs.pop("api_key", "unused"), max_retries=0,
                             timeout=120, **kwargs)

    def async_openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)

    def sdk(self) -> RagKVClient:
        return RagKVClient(f"127.0.0.1:{self.running.port}", timeout=120)


def stored(engine) -> dict:
    """Every block and text-index entry with its bytes: equal snapshots = nothing stored changed."""
    blocks = {k: bytes(engine.store.backend.get(k)) for k in engine.store.backend.keys()}
    index = {k: bytes(engine.text_index.backend.get(k)) for k in engine.text_index.backend.keys()}
    return {"blocks": blocks, "index": index}


def ragkv_of(response) -> dict:
    """The `ragkv` extension object of an openai-package response."""
    return response.model_extra["ragkv"]


def settled(engine, timeout_s: float = 120.0) -> dict:
    """The store once the engine's idle-time jobs are done (a snapshot unchanged over a second)."""
    deadline = time.monotonic() + timeout_s
    last = stored(engine)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = stored(engine)
        if now == last and not engine.scheduler.background:
            return now
        last = now
    raise AssertionError("the store kept changing")
