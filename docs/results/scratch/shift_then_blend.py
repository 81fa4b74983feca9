"""Scratch: blend after shifting every stored chunk key by its chunk's mean key drift (oracle: exact, from the
full prefill), so the deviation check measures what the mean does not explain ("shift, then select")."""
import sys
from dataclasses import dataclass
import torch
from ragkv.bench.quality.configs import Blend, Prepared, config_kind
from workers.blend import blend_prefill, fuse_chunks
from workers.drift import chunk_index, key_drift, shift_keys, value_drift, shift_values

@config_kind("shiftblend")
@dataclass(frozen=True)
class ShiftBlend(Blend):
    spec: str = "k"
    @classmethod
    def parse(cls, name, arg, number, flag):
        return cls(name, spec=arg or "k", ratio=number)
    def prepare(self, ctx):
        runner, layout = ctx.runner, ctx.layout
        cache, computed = fuse_chunks(runner, layout, ctx.prefix_kv(), self.chunks(ctx))
        exact, _ = fuse_chunks(runner, layout, ctx.prefix_kv(), ctx.in_context_chunks("fp16"))
        tokens = torch.cat([torch.arange(s, e) for s, e in layout.chunk_spans])
        chunk_of, n = chunk_index(tokens, layout.chunk_spans), len(layout.chunk_spans)
        first = 1 if "skip0" in self.spec else 0
        answer = [j for j, c in enumerate(ctx.prompt.chunks) if any(a in c for a in ctx.prompt.answers)]
        if "skipprobe" in self.spec:
            from workers.selection import SelectionContext, question_attention
            chunk_tokens = (~computed).nonzero().flatten()
            chunk_tokens = chunk_tokens[chunk_tokens >= layout.prefix_len]
            att = question_attention(SelectionContext(runner, layout, cache, chunk_tokens, computed.nonzero().flatten(), 0), None)
            mass = torch.stack([att[s + 4:e].sum() for s, e in layout.chunk_spans])
            k = int(self.spec[-1])
            answer = torch.argsort(mass, descending=True)[:k].tolist()
            hit = any(a in ctx.prompt.chunks[j] for j in answer for a in ctx.prompt.answers)
            print("PROBE", ctx.prompt.family, answer, "hit" if hit else "miss", flush=True)
        for i, (mine, right) in enumerate(zip(cache.layers, exact.layers)):
            pos = mine.positions[tokens]
            d = key_drift(right.keys[:, tokens], mine.keys[:, tokens], pos, runner.inv_freq, chunk_of, n)
            if first:
                d[:, 0] = 0
            if "skipans" in self.spec or "skipprobe" in self.spec:
                d[:, answer] = 0
            mine.keys[:, tokens] = shift_keys(mine.keys[:, tokens], d[:, chunk_of], pos, runner.inv_freq)
            if "v" in self.spec:
                dv = value_drift(right.values[:, tokens], mine.values[:, tokens], chunk_of, n)
                mine.values[:, tokens] = shift_values(mine.values[:, tokens], dv[:, chunk_of])
        logits, stats = blend_prefill(runner, layout, cache, computed, self.blend_config(ctx.default_blend))
        return Prepared(logits, cache, stats=stats)

from ragkv.cli import main
sys.exit(main(sys.argv[1:]))
