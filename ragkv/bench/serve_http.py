"""`ragkv bench serve --api http`: time to first token through the OpenAI-compatible HTTP API beside gRPC.

One `ragkv serve --http-port` subprocess; the same requests (CHUNKS_PER_REQUEST stored chunks, a
question) in `full` and `blend`, alternately through the gRPC SDK (GenerateStream) and the `openai`
package (a streamed chat completion with the chunks as `documents`), one client at a time. TTFT is
client side: from the call to its first streamed text piece. Both paths give the engine the same
prompt, so the difference is what the HTTP stack adds (`http_overhead_p50_s`).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from ragkv.bench.load import ServerProcess, corpus, percentile
from ragkv.bench.serve import CHUNKS_PER_REQUEST, MEMORY_BUDGET, QUESTIONS

MODES = ("full", "blend")


def _grpc_ttft(client, question: str, chunks: list[str], mode: str, max_new_tokens: int) -> tuple[float, str]:
    started, first = time.perf_counter(), None
    stream = client.generate_stream(question, chunks=chunks, mode=mode, max_new_tokens=max_new_tokens)
    for _piece in stream:
        first = first or time.perf_counter()
    return (first or time.perf_counter()) - started, stream.result.text


def _http_ttft(client, question: str, chunks: list[str], mode: str, max_new_tokens: int) -> tuple[float, str]:
    started, first, parts = time.perf_counter(), None, []
    stream = client.chat.completions.create(model="default", messages=[{"role": "user", "content": question}],
                                            max_tokens=max_new_tokens, stream=True,
                                            extra_body={"documents": chunks, "ragkv": {"mode": mode}})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            parts.append(chunk.choices[0].delta.content)
    return (first or time.perf_counter()) - started, "".join(parts)


def _figures(ttfts: list[float]) -> dict:
    return {"ttft_p50_s": round(percentile(ttfts, 0.5), 4), "ttft_p99_s": round(percentile(ttfts, 0.99), 4),
            "requests": len(ttfts)}


def run(quick: bool = False, progress: bool = True, requests: int | None = None, max_new_tokens: int = 4) -> dict:
    import openai
    from tqdm import tqdm

    from client import RagKVClient
    from kvstore.testing import free_port

    n = requests or (6 if quick else 24)
    chunks = corpus(CHUNKS_PER_REQUEST * n)
    groups = [chunks[i:i + CHUNKS_PER_REQUEST] for i in range(0, len(chunks), CHUNKS_PER_REQUEST)]
    http_port = free_port()
    ttfts = {mode: {"grpc": [], "http": []} for mode in MODES}
    same_text = True
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragkv-serve-http-") as tmp:
        server = ServerProcess(Path(tmp), MEMORY_BUDGET, ("--http-port", str(http_port)))
        try:
            server.wait_ready(300)
            api = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0,
                                timeout=600)
            with RagKVClient(f"127.0.0.1:{server.port}", timeout=600) as grpc:
                grpc.ingest(chunks)
                for api_name, call in (("grpc", grpc), ("http", api)):  # warm-up: prefix block, connections
                    (_grpc_ttft if api_name == "grpc" else _http_ttft)(call, QUESTIONS[0], groups[0], "blend", 2)
                with tqdm(total=2 * n * len(MODES), desc="serve --api http", disable=not progress,
                          file=sys.stderr) as bar:
                    for i in range(n):
                        for mode in MODES:
                            question = QUESTIONS[i % len(QUESTIONS)]
                            order = (("grpc", grpc, _grpc_ttft), ("http", api, _http_ttft))
                            texts = []
                            for name, call, measure in order if i % 2 == 0 else order[::-1]:  # alternate who goes first
                                ttft, text = measure(call, question, groups[i % len(groups)], mode, max_new_tokens)
                                ttfts[mode][name].append(ttft)
                                texts.append(text)
                                bar.update(1)
                            same_text = same_text and texts[0] == texts[1]
        finally:
            server.stop()
    modes = {mode: {name: _figures(values) for name, values in by_api.items()} for mode, by_api in ttfts.items()}
    return {
        "api": "http",
        "modes": modes,
        "http_overhead_p50_s": {mode: round(m["http"]["ttft_p50_s"] - m["grpc"]["ttft_p50_s"], 4)
                                for mode, m in modes.items()},
        "clients": {1: {mode: m for mode, m in modes.items()}},
        "texts_equal": same_text,
        "settings": {"chunks_per_request": CHUNKS_PER_REQUEST, "max_new_tokens": max_new_tokens, "requests": n},
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
