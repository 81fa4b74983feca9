"""Where does plain reuse lose answers? Oracle caches mixing exact and stored chunk KV (research/blend.md, "Key drift").

    PYTHONPATH=research python -m ragkv_research.key_drift_study --split dev --per-family 2 --part 0/2 --json OUT

Every oracle starts from the fused cache of stored chunks (the engine's chunk form, fp16) and copies
parts of the exact full-prefill KV of the same chunks over it, then runs the question as plain reuse
does. Config names (`oracle:SPEC`, registered here only, for this study):

    oracle:kA-B   exact keys in layers [A, B)        oracle:vA-B   exact values in layers [A, B)
    oracle:bA-B   exact keys and values in [A, B)
    oracle:mean   each chunk's stored keys shifted by its own exact mean pre-RoPE key drift
    oracle:meanskip   the same, except the chunk that holds the answer (left as stored)

and, blended (the default setting, without the model's context drift) after that shift:

    shifted:k | shifted:kv          every chunk's keys (and values) by its own exact mean drift
    shifted:kv-answer               ... except the chunk that holds the answer
    shifted:kv-probe1 | kv-probe2   ... except the one / two chunks the question probe attends to most
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch

from ragkv.bench.quality.configs import Blend, Prepared, config_kind, parse_config
from workers.blend import BlendConfig, blend_prefill, fuse_chunks
from workers.cache import KVCache
from ragkv_research.drift import chunk_index, key_drift, shift_keys, shift_values, value_drift
from ragkv_research.selection import question_attention
from workers.selection import SelectionContext


def stored_and_exact(ctx, chunks) -> tuple[KVCache, torch.Tensor, KVCache]:
    """The fused cache of `chunks` (-> cache, computed) and the same prompt's exact full-prefill chunk KV, fused."""
    stored, computed = fuse_chunks(ctx.runner, ctx.layout, ctx.prefix_kv(), chunks)
    exact, _ = fuse_chunks(ctx.runner, ctx.layout, ctx.prefix_kv(), ctx.in_context_chunks("fp16"))
    return stored, computed, exact


def answer_chunks(ctx) -> list[int]:
    """Indices of the prompt's chunks that hold an expected answer."""
    return [i for i, chunk in enumerate(ctx.prompt.chunks) if any(a in chunk for a in ctx.prompt.answers)]


def shift_by_exact_drift(runner, layout, stored: KVCache, exact: KVCache, alone: list[int], values: bool) -> None:
    """Shift each stored chunk's keys (and values) by its own exact mean drift against `exact`, in place;
    the chunks in `alone` stay as stored."""
    tokens = torch.cat([torch.arange(start, end) for start, end in layout.chunk_spans])
    chunk_of, chunks = chunk_index(tokens, layout.chunk_spans), len(layout.chunk_spans)
    for mine, right in zip(stored.layers, exact.layers):
        positions = mine.positions[tokens]
        keys = key_drift(right.keys[:, tokens], mine.keys[:, tokens], positions, runner.inv_freq,
                         chunk_of, chunks)  # [Hkv, C, D]: each chunk's own exact mean
        keys[:, alone] = 0
        mine.keys[:, tokens] = shift_keys(mine.keys[:, tokens], keys[:, chunk_of], positions, runner.inv_freq)
        if values:
            drift = value_drift(right.values[:, tokens], mine.values[:, tokens], chunk_of, chunks)
            drift[:, alone] = 0
            mine.values[:, tokens] = shift_values(mine.values[:, tokens], drift[:, chunk_of])


@config_kind("oracle")
@dataclass(frozen=True)
class Oracle(Blend):
    spec: str = ""

    @classmethod
    def parse(cls, name, arg, number, flag):
        return cls(name, spec=arg or "", reuse=True)

    def prepare(self, ctx) -> Prepared:
        runner, layout = ctx.runner, ctx.layout
        stored, computed, exact = stored_and_exact(ctx, ctx.stored_chunks("fp16"))
        if self.spec.startswith("mean"):
            alone = answer_chunks(ctx) if self.spec == "meanskip" else []
            shift_by_exact_drift(runner, layout, stored, exact, alone, values=False)
        else:
            part, (low, high) = self.spec[0], map(int, self.spec[1:].split("-"))
            for mine, right in list(zip(stored.layers, exact.layers))[low:high]:
                if part in "kb":
                    mine.keys.copy_(right.keys)
                if part in "vb":
                    mine.values.copy_(right.values)
        logits, stats = blend_prefill(runner, layout, stored, computed, BlendConfig(), reuse=True)
        return Prepared(logits, stored, stats=stats)


@config_kind("shifted")
@dataclass(frozen=True)
class ShiftedBlend(Blend):
    """Blend after each stored chunk is shifted by its own exact mean K (and V) drift (research/blend.md, "Shift, then blend")."""

    spec: str = "kv"

    @classmethod
    def parse(cls, name, arg, number, flag):
        return cls(name, spec=arg or "kv", ratio=number, shift=False)

    def prepare(self, ctx) -> Prepared:
        runner, layout = ctx.runner, ctx.layout
        stored, computed, exact = stored_and_exact(ctx, self.chunks(ctx))
        alone = self._left_alone(ctx, stored, computed)
        shift_by_exact_drift(runner, layout, stored, exact, alone, values=self.spec.startswith("kv"))
        logits, stats = blend_prefill(runner, layout, stored, computed, self.blend_config(ctx.default_blend))
        return Prepared(logits, stored, stats=stats)

    def _left_alone(self, ctx, cache, computed) -> list[int]:
        """Chunk indices left unshifted: the answer's (an oracle) or the question probe's top ones."""
        layout = ctx.layout
        if self.spec.endswith("answer"):
            return answer_chunks(ctx)
        if "probe" not in self.spec:
            return []
        candidates = (~computed).nonzero().flatten()
        candidates = candidates[candidates >= layout.prefix_len]
        probe = SelectionContext(ctx.runner, layout, cache, candidates, computed.nonzero().flatten(), 0)
        attention = question_attention(probe, None)  # writes only the always-computed slots, rewritten by blend
        mass = torch.stack([attention[start + 4:end].sum() for start, end in layout.chunk_spans])
        return torch.argsort(mass, descending=True)[: int(self.spec[-1])].tolist()


DEFAULT_ORACLES = ("reuse", "oracle:b0-10", "oracle:b10-20", "oracle:b20-30", "oracle:b10-30", "oracle:k0-30",
                   "oracle:v0-30", "oracle:mean", "oracle:meanskip")


def main() -> None:
    from ragkv.bench.quality.evaluate import evaluate_prompt
    from ragkv.bench.quality.prompts import make_prompts
    from workers.engine import EngineConfig
    from workers.runner import ModelRunner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="dev", choices=("dev", "test"))
    parser.add_argument("--per-family", type=int, default=2)
    parser.add_argument("--part", default="0/1", help="I/N: every N-th prompt from the I-th (run N side by side)")
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_ORACLES))
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runner = ModelRunner.load("default")
    part, parts = map(int, args.part.split("/"))
    prompts = make_prompts(args.split, lambda t: len(runner.tokenize(t)), None, args.per_family, (1100,))[part::parts]
    configs = [parse_config(name) for name in ["full", *args.configs]]
    rows = []
    for i, prompt in enumerate(prompts):
        out = evaluate_prompt(runner, prompt, configs, EngineConfig().codec)
        rows.append({"family": prompt.family, **{k: [o.correct, o.agree, o.kl] for k, o in out.items()}})
        print(i, prompt.family, {k: (int(o.correct), round(o.kl, 3)) for k, o in out.items()}, flush=True)
    with open(args.json, "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main()
