"""wk4v3 key decode, this checkout's token-major path against the previous channel-major one (kept here as
`channel_major`, the old code, bit-equal), alternated in one process over the engine's codec (model's key plan)
at token counts 118-145. Values are decoded the same way by both."""
import statistics, time, torch
from workers.allocator import retain_freed_memory
retain_freed_memory()
from kvstore.codecs import quant
from kvstore.codecs.base import PayloadReader
from kvstore.codecs.planned import ROW
from workers.key_plan import codec_for_model
from workers.runner import ModelRunner


def channel_major(codec, payload, shape):
    """A block as the previous checkout decoded it: keys [C, T] channel-major, then one transpose; values as now."""
    r = PayloadReader(payload, codec.payload_size(shape), None)
    layers, heads, tokens, dim = shape
    key_groups = quant.num_groups(tokens, codec.key_group)
    channels = torch.empty(layers * heads * dim, tokens)
    for bits, idx in codec._groups(shape):
        rows = -(-idx.numel() // ROW)
        codes = r.take(torch.uint8, (rows, tokens, bits))
        scale = r.take(torch.float16, (rows, ROW, key_groups))
        zero = r.take(torch.float16, (rows, ROW, key_groups))
        q = quant.unpack_bits(codes, bits).transpose(-1, -2)  # [R, 8, T]
        x = quant.dequantize_asym(q, scale, zero, codec.key_group)
        channels.index_copy_(0, idx, x.reshape(rows * ROW, tokens)[: idx.numel()])
    keys = channels.view(layers, heads, dim, tokens).transpose(2, 3).contiguous()
    return keys, codec._values(dim).decode(r, (layers, heads), tokens, dim, torch.float32)


def token_major(codec, payload, shape):
    return codec.decode(payload, shape, torch.float32)


r = ModelRunner.load("default").with_kernel("bf16")
codec = codec_for_model("wk4v3", r)
base = r.tokenize("The lighthouse keeper counted ships every evening in a green ledger. " * 20)
blocks = []
for n in range(118, 146):
    kv = r.chunk_kv(base[:n]).with_rope(True)
    blocks.append((codec.encode(kv.keys, kv.values), tuple(kv.keys.shape)))
assert all(torch.equal(a, b) for p, s in blocks for a, b in zip(channel_major(codec, p, s), token_major(codec, p, s)))
runs = {"channel_major": [], "token_major": []}
for _ in range(8):
    for name, fn in (("channel_major", channel_major), ("token_major", token_major)):
        ts = []
        for payload, shape in blocks:
            t = time.perf_counter(); fn(codec, payload, shape); ts.append(time.perf_counter() - t)
        runs[name].append(statistics.median(ts))
print({k: round(statistics.median(v) * 1e3, 2) for k, v in runs.items()}, "ms a block")
