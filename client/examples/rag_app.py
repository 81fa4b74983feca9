"""A small RAG app on the SDK: keyword-overlap retrieval over text files, answers from ragkv.

    ragkv serve &                                   # in another terminal
    python client/examples/rag_app.py "What is CacheBlend?" [--docs DIR] [--target HOST:PORT]

The documents are split into paragraph chunks and ingested once (content-addressed, so
running it again re-uses the stored KV); each question sends the ids of the best chunks.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from client import RagKVClient

DEFAULT_DOCS = Path(__file__).resolve().parents[2] / "ragkv" / "data" / "docs"
WORD = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset("a an and are as at be by for from how in is it of on or that the this to was what when "
                      "where which who why with does do".split())


def words(text: str) -> Counter:
    return Counter(w for w in WORD.findall(text.lower()) if w not in STOPWORDS)


def split_chunks(text: str, max_chars: int = 1200) -> list[str]:
    """Paragraphs, merged until max_chars."""
    chunks, current = [], ""
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        if current and len(current) + len(para) + 2 > max_chars:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    if current:
        chunks.append(current)
    return chunks


def retrieve(question: str, chunks: list[str], k: int) -> list[int]:
    """Indices of the k chunks sharing the most (question-weighted) words with the question."""
    q = words(question)
    scored = [(sum(min(n, c[w]) for w, n in q.items()), -i) for i, c in enumerate(map(words, chunks))]
    return [-neg for score, neg in sorted(scored, reverse=True)[:k] if score > 0] or [0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("question", nargs="+")
    p.add_argument("--docs", type=Path, default=DEFAULT_DOCS)
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--token")
    p.add_argument("-k", type=int, default=3, help="chunks per question")
    p.add_argument("--mode", default="blend", choices=("full", "prefix", "reuse", "shift", "blend"))
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args(argv)

    chunks = [c for path in sorted(args.docs.glob("*.txt")) for c in split_chunks(path.read_text())]
    if not chunks:
        p.error(f"no .txt documents in {args.docs}")
    question = " ".join(args.question)
    with RagKVClient(args.target, token=args.token, timeout=300) as c:
        refs = c.ingest(chunks)  # cheap after the first run: every chunk comes back cached=True
        picked = [refs[i] for i in retrieve(question, chunks, args.k)]
        stream = c.generate_stream(question, chunks=picked, mode=args.mode, max_new_tokens=args.max_new_tokens)
        for piece in stream:
            print(piece, end="", flush=True)
        r = stream.result
        print(f"\n\n[{len(picked)} chunks, {r.stats['chunks_hit']} from the cache; ttft {r.ttft_s * 1e3:.0f} ms, "
              f"total {r.total_s:.2f} s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
