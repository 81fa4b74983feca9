"""The prompt this session's scripts share: the blend bench's first query (make_queries, seed 0, 8 chunks of
`chunk_tokens`), its KV held with pre-RoPE keys (the default codec's form), the bf16 prefill kernel, and the
engine's allocator settings."""
from workers.allocator import retain_freed_memory
from ragkv.bench.rag_dataset import make_queries
from workers.pipeline import HeldChunks
from workers.prompt import build_prompt
from workers.runner import ModelRunner


def bench_prompt(chunk_tokens: int = 128):
    """-> (runner, layout, held chunks)"""
    retain_freed_memory()
    r = ModelRunner.load("default").with_kernel("bf16")
    q = make_queries(1, 8, chunk_tokens, lambda t: len(r.tokenize(t)), seed=0)[0]
    layout = build_prompt(r.tokenizer, "", [r.tokenize(c) for c in q.chunks], q.question)
    held = HeldChunks(r.chunk_kv(layout.prefix_ids), [r.chunk_kv(r.tokenize(c)).with_rope(True) for c in q.chunks])
    return r, layout, held
