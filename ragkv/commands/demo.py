"""`ragkv demo`: the main job on the embedded default model.

Starts an embedded server on a free loopback port, ingests the sample documents
through the SDK, shows what was stored, then asks each sample question over its
retrieved documents in `full` and `blend` mode, twice (the second time the documents
are served exactly from the sequence tree), and prints answers, TTFT, speedup and
hits side by side; then one question through the `openai` client.
"""

from __future__ import annotations

import argparse
import statistics

from kvstore.backends.redis_backend import redact_url
from kvstore.codecs import CODECS, DEFAULT_CODEC
from ragkv.commands.errors import checked_model
from workers.model import MODEL_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help=MODEL_HELP)
    parser.add_argument("--store", default="", help="disk:PATH or redis://HOST:PORT/DB (default: disk under the cache dir)")
    # unset: the serving default (kvstore.codecs.DEFAULT_CODEC, chosen by the quality suite); the stored-bytes
    # table still shows what every codec would take
    parser.add_argument("--codec", choices=sorted(CODECS), default=None,
                        help=f"codec of stored chunks (default {DEFAULT_CODEC}, as `ragkv serve`)")
    parser.add_argument("--max-new-tokens", type=int, default=24)


def _stored_bytes_table(engine, refs, console) -> None:
    """Bytes of the ingested chunks' KV under every codec (encoded for real, not estimated)."""
    from rich.table import Table

    from kvstore.block import encode_block
    from kvstore.codecs import make_codec

    # encode freshly computed KV: re-encoding KV decoded from the serving codec would flatter the others
    headers = [h for h in (engine.store.get_header(ref.id) for ref in refs) if h is not None]

    def sizes_of() -> dict[str, int]:
        kvs = [engine.runner.chunk_kv(list(h.token_ids)) for h in headers]
        return {name: sum(len(encode_block(kv, make_codec(name), engine.runner.fingerprint)) for kv in kvs)
                for name in CODECS}

    # model work on the engine's thread: a second OpenMP pool here would slow the timed requests (workers/openmp.py)
    sizes = engine.scheduler.call(sizes_of)
    tokens = sum(ref.num_tokens for ref in refs)
    table = Table(title=f"stored: {len(refs)} chunks, {tokens} tokens")
    for column in ("codec", "bytes", "bytes/token", "ratio vs fp16"):
        table.add_column(column, justify="right")
    for name, size in sizes.items():
        marker = " (serving)" if name == engine.config.codec else ""
        table.add_row(name + marker, f"{size:,}", f"{size / tokens:,.0f}", f"{sizes['fp16'] / size:.1f}x")
    console.print(table)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import track

    from client import RagKVClient
    from ragkv.config import ServeConfig
    from workers.samples import sample_documents, sample_questions
    from ragkv.server.app import build_engine, start_server

    console = Console(width=max(Console().width, 150))
    config = ServeConfig(host="127.0.0.1", port=0).with_overrides(model=checked_model("demo", args.model), store=args.store, codec=args.codec)
    with console.status(f"loading model {args.model!r} (first run converts the GGUF once)..."):
        engine = build_engine(config)
    running = start_server(config, engine)
    target = f"127.0.0.1:{running.port}"
    console.print(f"[bold]ragkv demo[/bold]: embedded server on {target}, store {redact_url(config.store_url)}, codec {config.codec}")
    try:
        with RagKVClient(target) as client:
            docs = sample_documents()
            refs = []
            for name, text in track(list(docs.items()), description="ingesting sample documents", console=console):
                refs += client.ingest([text], pin=False)
            _stored_bytes_table(engine, refs, console)
            _ask(client, engine, list(docs.values()), sample_questions(), args.max_new_tokens, console)
        _ask_openai(running, config, list(docs.values()), sample_questions()[0], args.max_new_tokens, console)
    finally:
        running.drain(5)
        engine.close()
    return 0


def _ask_openai(running, config, docs, question, max_new_tokens, console) -> None:
    """One question through the `openai` package against the OpenAI-compatible API (ragkv serve --http-port):
    the documents pasted into the message, found in the store by their text."""
    import openai

    from ragkv.server.openai.app import HttpSettings, served_models, start_http

    running.http = start_http("127.0.0.1", 0, running.engine, running.admission, running.metrics,
                              HttpSettings(models=served_models(config.model)))
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{running.http.port}/v1", api_key="unused")
    r = client.chat.completions.create(model=config.model, max_tokens=max_new_tokens, messages=[
        {"role": "user", "content": "\n\n".join([*docs, question.question])}])
    stats = r.model_extra["ragkv"]
    console.print(f"[bold]openai client[/bold] on http://127.0.0.1:{running.http.port}/v1: {question.question!r} -> "
                  f"{_first_line(r.choices[0].message.content)!r} (chunks hit {stats['chunks_hit']}/{len(docs)}, "
                  f"TTFT {stats['ttft_s']:.2f}s, {stats['mode']})")


def _first_line(text: str, limit: int = 70) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


RETRIEVED = 4  # documents a question retrieves (the demo's retriever: word overlap, best first)


def retrieve(question: str, docs: list[str], k: int = RETRIEVED) -> list[str]:
    """The k documents sharing the most words with the question, best first: each question its own set,
    ordered the way a retriever orders them."""
    words = {w.strip(".,?!:;\"'()").lower() for w in question.split()}
    def overlap(doc: str) -> int:
        return len(words & {w.strip(".,?!:;\"'()").lower() for w in doc.split()})
    return sorted(docs, key=overlap, reverse=True)[:k]


def _ask(client, engine, chunks, questions, max_new_tokens, console) -> None:
    """Each question over its retrieved documents, in `full` and `blend`, twice. The first time blend runs the
    server's setting: CacheBlend over the stored chunk KV where that ratio pays, else (the default ratio, see
    BlendConfig.exact_from) an exact prefill that stores the documents' sequence; a blended prompt's sequence
    is computed exactly while the server is idle. So the second time (another user, the same documents)
    blend reads them exactly from the sequence tree. `full` runs in a namespace of its own, so its exact
    prefills do not feed the tree. The "ran" column is what blend did (stats `blend_method`)."""
    from rich.table import Table

    table = Table(title=f"answers over each question's {RETRIEVED} retrieved documents (full prefill vs ragkv blend)",
                  show_lines=True)
    for column in ("round", "question", "expected", "full answer", "blend answer", "TTFT full", "TTFT blend",
                   "speedup", "ran", "chunks hit", "exact (tree)"):
        table.add_column(column)
    speedups: dict[int, list[float]] = {1: [], 2: []}
    correct = {"full": 0, "blend": 0}
    for round_ in (1, 2):
        for q in questions:
            retrieved = retrieve(q.question, chunks)
            full = client.generate(q.question, chunks=retrieved, mode="full", max_new_tokens=max_new_tokens,
                                   namespace="demo-full")
            blend = client.generate(q.question, chunks=retrieved, mode="blend", max_new_tokens=max_new_tokens)
            correct["full"] += q.answer.lower() in full.text.lower()
            correct["blend"] += q.answer.lower() in blend.text.lower()
            speedups[round_].append(full.ttft_s / blend.ttft_s)
            table.add_row(str(round_), q.question, q.answer, _first_line(full.text), _first_line(blend.text),
                          f"{full.ttft_s:.2f}s", f"{blend.ttft_s:.2f}s", f"{speedups[round_][-1]:.1f}x",
                          str(blend.stats.get("blend_method", "")), f"{blend.stats['chunks_hit']}/{len(retrieved)}",
                          f"{blend.stats.get('sequence_chunks', 0)}/{len(retrieved)}")
        engine.scheduler.wait_idle(120)  # a pause between users: the server computes the blended documents exactly
    console.print(table)
    n = 2 * len(questions)
    every = speedups[1] + speedups[2]
    console.print(f"prompts ~{full.stats['prompt_tokens']} tokens; median TTFT speedup blend vs full: "
                  f"[bold]{statistics.median(every):.1f}x[/bold] (first time {statistics.median(speedups[1]):.1f}x, "
                  f"documents seen before {statistics.median(speedups[2]):.1f}x); correct: full {correct['full']}/{n}, "
                  f"blend {correct['blend']}/{n}")

