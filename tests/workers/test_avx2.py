"""The avx2 decode kernels (workers/batching/avx2.c through avx2.py): the model's own GGUF blocks, integer
dot products, one C call per decoder layer.

Tolerances, measured on the default model: the blocks hold the weights exactly and the activations keep ~15
bits (x = d (hi + lo / 256)), so a matrix-vector product is within ~2e-5 of fp32's, relative (checked at 1e-4:
a wrong nibble order or scale is off by O(1)). A whole decode step at 1,100 cached tokens differed from the
fp32 step by 0.0017 in its logits (int4's differs by 0.2); STEP_ATOL leaves a 10x margin.
Batch invariance and the mixed-batch engine runs are the parametrized tests of test_batching.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from workers.batching import avx2
from workers.batching.linear import Avx2Linear, pack_int4, q4_groups, q8_groups
from workers.batching.step import decode_step
from workers.cache import KVCache, LayerKV

pytestmark = pytest.mark.skipif(avx2.unavailable() is not None, reason=f"avx2 kernels: {avx2.unavailable()}")

STEP_ATOL = 0.02
NEW_TOKENS = 8
TEXT = ("The lighthouse of Kerrow Point was built in 1871 by the engineer Maud Ellery. Its lamp burned "
        "whale oil until 1904, then paraffin, and it was automated in 1969. ") * 6


def _blocks_to_matrix(blocks: avx2.Blocks) -> torch.Tensor:
    """The blocks' bytes decoded in torch, the GGUF way."""
    data = blocks.data  # [n, k / 32, bytes]
    d = data[..., 0:2].contiguous().view(torch.float16).float()  # [n, b, 1]
    if blocks.format == avx2.Q4_1:
        m = data[..., 2:4].contiguous().view(torch.float16).float()
        nibbles = data[..., 4:].to(torch.int32)
        codes = torch.cat([nibbles & 15, nibbles >> 4], -1).float()  # code i low, code i + 16 high
        return (codes * d + m).reshape(blocks.n, blocks.k)
    return (data[..., 2:].contiguous().view(torch.int8).float() * d).reshape(blocks.n, blocks.k)


@pytest.fixture(scope="module")
def prefilled(runner):
    ids = torch.tensor(runner.tokenize(TEXT)[:200])
    cache = KVCache.empty(runner.shape.num_layers)
    logits = runner.forward(ids, torch.arange(len(ids)), cache)
    return cache, int(logits.argmax()), len(ids)


def _clone(cache: KVCache) -> KVCache:
    return KVCache([LayerKV(l.keys.clone(), l.values.clone(), l.positions.clone()) for l in cache.layers])


def test_blocks_hold_the_gguf_weights_exactly(runner):
    attn = runner.layers[0].self_attn
    q4 = avx2.pack(attn.q_proj.weight.detach())
    q8 = avx2.pack(runner.model.lm_head.weight.detach())  # the Q8_0 embedding
    assert (q4.format, q8.format) == (avx2.Q4_1, avx2.Q8_0)
    assert q4.data.shape[-1] == 20 and q8.data.shape[-1] == 34  # the GGUF block sizes
    assert torch.equal(_blocks_to_matrix(q4), attn.q_proj.weight.detach())
    assert torch.equal(_blocks_to_matrix(q8), runner.model.lm_head.weight.detach())
    assert avx2.pack(torch.randn(8, 64)) is None  # not GGUF blocks: refused
    # the same groups linear.q4_groups / q8_groups find (torch's arithmetic), code for code
    codes, d, m = q4_groups(attn.q_proj.weight.detach())
    nibbles = q4.data[..., 4:].to(torch.int32)
    assert torch.equal(torch.cat([nibbles & 15, nibbles >> 4], -1).reshape(codes.shape), codes)
    codes8, d8 = q8_groups(runner.model.lm_head.weight.detach())
    assert torch.equal(q8.data[..., 2:].contiguous().view(torch.int8).reshape(codes8.shape).to(torch.int32), codes8)
    off = attn.q_proj.weight.detach().clone()
    off[100, 7] += 1e-3  # one weight off its block's grid, past the probed rows
    assert avx2.pack(off) is None


@pytest.mark.parametrize("which", ["gate_up", "down", "lm_head"])
def test_matvec_equals_the_fp32_product(runner, which):
    weights = runner.decode_weights("avx2", 4)
    linear = weights.lm_head if which == "lm_head" else getattr(weights.layers[5], which)
    assert isinstance(linear, Avx2Linear)
    weight = _blocks_to_matrix(linear.blocks)
    x = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(1))
    x[1, :40] *= 30  # an outlier block
    want = x.double() @ weight.double().T
    got = linear(x).double()
    assert float((got - want).norm() / want.norm()) < 1e-4
    int4 = pack_int4(weight)(x).double()
    assert float((got - want).norm()) < 0.05 * float((int4 - want).norm())  # far closer than bf16 activations


def test_step_agrees_with_fp32_and_decodes_its_greedy_tokens(runner, prefilled):
    cache, token, n = prefilled
    fast, exact = runner.decode_weights("avx2", 4), runner.decode_weights("fp32", 4)
    assert fast.native is not None and fast.kernels_used() == {"avx2": 1 + 4 * runner.shape.num_layers}
    a, b = _clone(cache), _clone(cache)
    tokens = {"avx2": [token], "fp32": [token]}
    for step in range(NEW_TOKENS):
        got = decode_step(runner, fast, [tokens["avx2"][-1]], [n + step], [a])
        want = decode_step(runner, exact, [tokens["fp32"][-1]], [n + step], [b])
        assert torch.allclose(got, want, atol=STEP_ATOL)
        tokens["avx2"].append(int(got.argmax()))
        tokens["fp32"].append(int(want.argmax()))
    assert tokens["avx2"] == tokens["fp32"]
    for x, y in zip(a.layers, b.layers):  # the C layer wrote the same cache entries (RoPE, slots)
        torch.testing.assert_close(x.keys, y.keys, atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(x.values, y.values, atol=2e-3, rtol=1e-3)


def test_observers_see_the_rotated_queries(runner, prefilled):
    cache, token, n = prefilled
    seen: dict[str, list] = {"avx2": [], "fp32": []}
    for kernel, queries in seen.items():
        observer = lambda layer, q, pos, kv, queries=queries: queries.append(q.clone())  # noqa: E731
        decode_step(runner, runner.decode_weights(kernel, 4), [token], [n], [_clone(cache)], observers=[observer])
    assert len(seen["avx2"]) == runner.shape.num_layers
    for got, want in zip(seen["avx2"], seen["fp32"]):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=5e-3, rtol=1e-3)


def test_a_machine_that_cannot_build_the_kernels_says_why(tmp_path):
    """No working C compiler: the library is None with the reason (the engine then decodes with int4)."""
    code = "from workers.batching import avx2; print(avx2.library() is None, '|', avx2.unavailable())"
    env = {**os.environ, "CC": "/bin/false", "RAGKV_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.startswith("True |") and "building avx2.c failed" in out


def test_a_prebuilt_library_is_used_without_a_compiler(tmp_path):
    """The container images compile in their build stage and run without a compiler: a library already in
    a native dir is loaded, never rebuilt."""
    built = avx2.build(tmp_path / "build")
    (tmp_path / "cache" / "native").mkdir(parents=True)
    shutil.copy(built, tmp_path / "cache" / "native" / built.name)
    code = "from workers.batching import avx2; print(avx2.unavailable())"
    env = {**os.environ, "CC": "/bin/false", "RAGKV_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.strip() == "None"
