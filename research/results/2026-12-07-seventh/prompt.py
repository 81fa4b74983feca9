"""The prompt the seventh session's blend measurements share: 8 chunks of 128 tokens (~1,074-token prompt),
their KV held (pre-RoPE keys: the default codec's form, unless `pre_rope=False`)."""
from workers.pipeline import HeldChunks
from workers.prompt import build_prompt
from workers.runner import ModelRunner

TEXT = "The lighthouse keeper counted ships every evening in a green ledger and wrote the weather beside each. "


def blend_prompt(pre_rope: bool = True):
    """-> (runner, layout, held chunks)"""
    r = ModelRunner.load("default")
    chunks = [r.tokenize((f"Document {i}. " + TEXT * 12))[:128] for i in range(8)]
    layout = build_prompt(r.tokenizer, "", chunks, "What did the keeper count in the ledger, and where?")
    held = HeldChunks(r.chunk_kv(layout.prefix_ids), [r.chunk_kv(c).with_rope(pre_rope) for c in chunks])
    return r, layout, held
