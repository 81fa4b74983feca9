"""The batched decode step (workers/batching) on Gemma 3 270M: per-layer RoPE tables, sliding windows, the
four-norm layer with (1 + weight) norms and GELU. The step must give the runner's forward, token for token
transformers' greedy `generate`, and a row's bits alone as in a batch. The long prompt (~580 tokens) is past
the 512-token window, so the local layers' window cuts into the cache at every decoded position.

Tolerance: the fp32 step differs from the runner's forward only in summation order (gemm rows padded to 4,
RoPE as a matmul, the mean square from a vector norm, matmul + softmax attention against SDPA): fp32
rounding, ~1e-5 on logits of magnitude ~20 here (measured 2e-5). The Llama test's 1e-3 leaves that a 50x
margin, and a layer computed wrong is far outside it: without the window the logits move by ~9, with one RoPE
table for every layer by more than 1 (both checked below, so the comparison can see them)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from workers.batching.layer import decode_layer_eager
from workers.batching.scheduler import BatchConfig, Scheduler
from workers.batching.sequence import Sequence
from workers.batching.step import DecodeWeights, Norm, check_servable, decode_step, mlp_activation
from workers.cache import KVCache, LayerKV
from workers.generate import SamplingParams
from workers.steps import RequestSteps

WINDOW = 512
ATOL = 1e-3  # fp32 step against the runner's forward (see the module docstring)
INT4_ATOL = 0.3  # int4 step against fp32: the default model's ("logits within ~0.3", docs/benchmarks.md)
NEW_TOKENS = 8
SENTENCE = "The keeper of the north light logged {} ships passing the reef in the year {}. "


def _ids(runner, sentences: int) -> list[int]:
    text = "".join(SENTENCE.format(17 * i, 1800 + i) for i in range(sentences))
    return [runner.tokenizer.bos_token_id] + runner.tokenize(text)


def _clone(cache: KVCache) -> KVCache:
    return KVCache([dataclasses.replace(kv, keys=kv.keys.clone(), values=kv.values.clone(),
                                        positions=kv.positions.clone()) for kv in cache.layers])


@dataclasses.dataclass
class Prefilled:
    ids: list[int]
    cache: KVCache  # never decoded into: clone it
    logits: torch.Tensor  # [1, vocab] of the last prompt token

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def token(self) -> int:
        return int(self.logits.argmax())


def _prefill(runner, ids: list[int]) -> Prefilled:
    cache = KVCache.empty(runner.shape.num_layers)
    return Prefilled(ids, cache, runner.forward(torch.tensor(ids), torch.arange(len(ids)), cache))


@pytest.fixture(scope="module")
def long(gemma_runner) -> Prefilled:
    ids = _ids(gemma_runner, 27)
    assert WINDOW + 50 < len(ids) < 650
    return _prefill(gemma_runner, ids)


@pytest.fixture(scope="module")
def short(gemma_runner) -> Prefilled:
    return _prefill(gemma_runner, _ids(gemma_runner, 3))


def _step(runner, weights: DecodeWeights, rows: list[Prefilled], **kwargs) -> torch.Tensor:
    return decode_step(runner, weights, [r.token for r in rows], [r.n for r in rows], [_clone(r.cache) for r in rows],
                       **kwargs)


def test_gemma_layers_are_read_per_layer(gemma_runner):
    weights = gemma_runner.decode_weights("fp32", 4)
    assert len(weights.rope_freqs) == 2  # local and global tables, each rotation computed once a step
    assert [layer.window for layer in weights.layers] == list(gemma_runner.windows)
    assert [layer.rope for layer in weights.layers] == [int(w is None) for w in gemma_runner.windows]
    assert all(layer.ffn_norms is not None and layer.qk_norms is not None for layer in weights.layers)


def test_fp32_step_equals_the_runner_forward_past_the_window(gemma_runner, long):
    weights = gemma_runner.decode_weights("fp32", 4)
    ref = gemma_runner.forward(torch.tensor([long.token]), torch.tensor([long.n]), _clone(long.cache))
    out = _step(gemma_runner, weights, [long])
    assert torch.allclose(out, ref, atol=ATOL) and int(out.argmax()) == int(ref.argmax())
    # the controls: the comparison sees a missing window and a wrong RoPE table
    no_window = [dataclasses.replace(layer, window=None) for layer in weights.layers]
    one_table = [dataclasses.replace(layer, rope=0) for layer in weights.layers]
    for layers in (no_window, one_table):
        wrong = _step(gemma_runner, dataclasses.replace(weights, layers=layers), [long])
        assert float((wrong - ref).abs().max()) > 1.0


def test_evicted_per_head_cache_past_the_window_equals_the_runner(gemma_runner, long):
    """Evicted entries (head_mask) inside and outside the window, per-head positions [Hkv, T]: the step's
    mask is the window and the head mask together, as the runner's attention has them."""
    gen = torch.Generator().manual_seed(0)
    layers = []
    for kv in long.cache.layers:
        keep = torch.rand(kv.keys.shape[:2], generator=gen) < 0.7  # [Hkv, T]
        layers.append(LayerKV(kv.keys.clone(), kv.values.clone(), kv.positions[None].clone(), head_mask=keep))
    evicted = KVCache(layers)
    weights = gemma_runner.decode_weights("fp32", 4)
    for step in range(2):
        position = long.n + step
        ref = gemma_runner.forward(torch.tensor([long.token]), torch.tensor([position]), _clone(evicted))
        out = decode_step(gemma_runner, weights, [long.token], [position], [evicted])
        assert torch.allclose(out, ref, atol=ATOL)
    assert evicted.layers[0].head_mask.shape == (1, long.n + 2)  # the step appended into the evicted layout


@pytest.mark.parametrize("kernel", ["fp32", "int4"])
def test_step_row_is_the_same_alone_and_in_a_batch(gemma_runner, long, short, kernel):
    weights = gemma_runner.decode_weights(kernel, 4)
    alone = _step(gemma_runner, weights, [long])
    batch = _step(gemma_runner, weights, [short, long, short])
    assert torch.equal(batch[1], alone[0])
    assert not torch.equal(batch[0], alone[0])


def test_scripted_layer_equals_the_eager_source(gemma_runner, long, short):
    weights = gemma_runner.decode_weights("fp32", 4)
    rows = [long, short]
    scripted, eager = [_clone(r.cache) for r in rows], [_clone(r.cache) for r in rows]
    for step in range(2):
        tokens, positions = [r.token + step for r in rows], [r.n + step for r in rows]
        a = decode_step(gemma_runner, weights, tokens, positions, scripted)
        b = decode_step(gemma_runner, weights, tokens, positions, eager, layer_fn=decode_layer_eager)
        assert torch.equal(a, b)
    assert all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
               for c, d in zip(scripted, eager) for x, y in zip(c.layers, d.layers))


def test_int4_step_agrees_with_fp32(gemma_runner, long):
    """Gemma's GGUF is Q4_K_M: with 640-wide rows (not a multiple of 256) q/k/gate/up are Q5_0, o Q4_K, down
    Q6_K, none of them 4-bit groups, and fall back to fp32; the Q8_0 embedding (the tied lm_head) packs."""
    weights = gemma_runner.decode_weights("int4", 4)
    assert weights.kernels_used() == {"int4": 1, "fp32": 4 * gemma_runner.shape.num_layers}
    avx2 = gemma_runner.decode_weights("avx2", 4)  # the default kernel serves the plain Llama layer only
    assert avx2.kernel == "int4" and avx2.native is None and "not the plain Llama form" in avx2.note
    fp32 = _step(gemma_runner, gemma_runner.decode_weights("fp32", 4), [long])
    int4 = _step(gemma_runner, weights, [long])
    assert torch.allclose(int4, fp32, atol=INT4_ATOL) and int(int4.argmax()) == int(fp32.argmax())


def test_greedy_decode_through_the_scheduler_equals_transformers_generate(gemma_runner, long, short):
    """The engine's decode path (Scheduler + RequestSteps.decode, fp32) on two prompts batched together, the
    long one past the window, against transformers' own greedy tokens."""
    runner, prompts = gemma_runner, {tuple(long.ids): long, tuple(short.ids): short}

    def prefill(seq: Sequence) -> None:  # the prompts' caches are already computed
        done = prompts[tuple(seq.request)]
        seq.cache, seq.logits, seq.next_position = _clone(done.cache), done.logits[0], done.n
        seq.stop_ids = runner.stop_token_ids

    steps = RequestSteps(runner, None, runner.decode_weights("fp32", 4), "alone")
    scheduler = Scheduler(BatchConfig(max_batch=2, decode_kernel="fp32"), prefill=prefill, decode=steps.decode)
    try:
        seqs = [Sequence(request=list(ids), params=SamplingParams(max_new_tokens=NEW_TOKENS)) for ids in prompts]
        for seq in seqs:
            scheduler.submit(seq)
        tokens = [[value for kind, value in seq.events() if kind == "token"] for seq in seqs]
        assert scheduler.stats.decode_steps < 2 * (NEW_TOKENS - 1)  # the two shared steps
    finally:
        scheduler.close()
    for ids, got in zip(prompts, tokens):
        with torch.inference_mode():
            ref = runner.model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
        ref = ref[0, len(ids):].tolist()
        stops = [i for i, t in enumerate(ref) if t in runner.stop_token_ids]
        assert got == ref[:stops[0] if stops else None]


def test_norm_forms_are_read_from_what_the_module_computes():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = torch.randn(3, 64, dtype=torch.bfloat16)
    for module, plus_one in ((Gemma3RMSNorm(64, eps=1e-6), True), (LlamaRMSNorm(64, eps=1e-6), False)):
        with torch.no_grad():
            module.weight.copy_(torch.randn(64) * 40)  # large weights: w and 1 + w are close
        module.to(torch.bfloat16)
        norm = Norm.of(module)
        assert norm.weight.dtype == (torch.float32 if plus_one else torch.bfloat16)
        torch.testing.assert_close(norm(x), module(x), atol=0, rtol=1e-2)


def test_what_the_step_cannot_compute_is_refused():
    with pytest.raises(ValueError, match="activation 'gelu'"):
        mlp_activation(SimpleNamespace(hidden_activation="gelu"))
    assert mlp_activation(SimpleNamespace(hidden_act="silu")) == 0
    with pytest.raises(ValueError, match="LayerNorm computes neither"):
        Norm.of(torch.nn.LayerNorm(64))
    linear = lambda bias=False: torch.nn.Linear(8, 8, bias=bias)  # noqa: E731
    mlp = SimpleNamespace(gate_proj=linear(), up_proj=linear(), down_proj=linear())
    with pytest.raises(ValueError, match="o_proj has a bias"):
        check_servable(SimpleNamespace(self_attn=SimpleNamespace(o_proj=linear(True)), mlp=mlp))
    with pytest.raises(ValueError, match="not a gated MLP"):
        check_servable(SimpleNamespace(self_attn=SimpleNamespace(o_proj=linear()), mlp=torch.nn.Sequential()))
