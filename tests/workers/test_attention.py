"""workers/attention.py: every plan (the row kernel, SDPA's causal path, the query blocks) equals the
position-masked attention it replaces."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from workers import row_attention
from workers.attention import PlanMemo, attend, causal_padding, plan_attention, query_blocks, visibility_mask

PATHS = ["rows", "sdpa"]  # the row kernel (workers/row_attention.c) and SDPA's plans
needs_rows = pytest.mark.skipif(row_attention.unavailable() is not None, reason=f"{row_attention.unavailable()}")


def _attend(path, q, k, v, qp, kp, scale, head_mask=None, window=None):
    if path == "rows" and row_attention.unavailable() is not None:
        pytest.skip(row_attention.unavailable())
    plan = plan_attention(qp, kp, head_mask, q.shape[0], window, q.dtype, rows=path == "rows")
    assert (plan.ranges is not None) == (path == "rows" and head_mask is None and q.dtype == torch.float32)
    return plan.run(q, k, v, scale)


def _masked(q, k, v, qp, kp, scale, window=None):
    mask = visibility_mask(qp, kp, None, q.shape[0], window)[None]
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[1], -1)


def test_causal_padding_only_for_the_newest_tokens_in_order():
    p = torch.arange(40)
    assert causal_padding(p, p) == 0  # a prefill over an empty cache
    assert causal_padding(p[8:], p) == 8  # after a reused 8-token prefix
    assert causal_padding(p[20:], p) is None  # padding would cost more than a quarter of the queries
    assert causal_padding(p[8:30], p) is None  # not the newest tokens
    assert causal_padding(p.flip(0), p.flip(0)) is None  # positions not increasing
    assert causal_padding(p, p[None].expand(3, -1)) is None  # per-head positions
    assert causal_padding(p[:1], p[:1]) is None


@pytest.mark.parametrize("path", PATHS)
def test_causal_fast_path_equals_the_masked_attention(path):
    torch.manual_seed(0)
    q, k, v = torch.randn(9, 70, 64), torch.randn(3, 70, 64), torch.randn(3, 70, 64)
    p = torch.arange(5, 75)  # a chunk's own positions, not starting at 0
    torch.testing.assert_close(_attend(path, q, k, v, p, p, 0.125), _masked(q, k, v, p, p, 0.125),
                               atol=1e-5, rtol=1e-4)
    tail = p[10:]  # after a reused prefix (SDPA: padded with zero queries)
    torch.testing.assert_close(_attend(path, q[:, 10:], k, v, tail, p, 0.125),
                               _masked(q[:, 10:], k, v, tail, p, 0.125), atol=1e-5, rtol=1e-4)


def _masked_heads(q, k, v, qp, kp, scale, head_mask):
    mask = visibility_mask(qp, kp, head_mask, q.shape[0])[None]
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[1], -1)


def test_query_blocks_cut_scattered_queries_to_the_keys_they_see():
    kp = torch.arange(1000)
    scattered = torch.arange(0, 1000, 5)  # 200 queries spread over the cache, as blend's selected tokens
    blocks = query_blocks(scattered, kp)
    assert blocks[0][0] == 0 and blocks[-1][1] == 200 and all(b == a for (_, b, *_), (a, *_) in zip(blocks, blocks[1:]))
    assert all(hi == int(scattered[b - 1]) + 1 for _, b, _, hi in blocks)  # up to each block's last query position
    assert {lo for _, _, lo, _ in blocks} == {0}  # no window: from the first key
    assert all(a % 16 == 0 for a, *_ in blocks)  # cut at multiples of the grain
    assert query_blocks(torch.arange(900, 1000), kp) is None  # the newest tokens: nothing to save
    assert query_blocks(scattered[:16], kp) is None  # one grain
    assert query_blocks(scattered.flip(0), kp) is None  # queries out of order
    assert query_blocks(scattered, kp[None].expand(3, -1)) is None  # per-head positions


def test_query_blocks_are_the_cheapest_cuts():
    """Against every cut of the rows at the grain (brute force over 2^(n-1) cuts of a small case), the chosen
    blocks cost least: key-rows plus the call cost per block; and a call cost no block can repay gives None."""
    import itertools

    kp = torch.arange(400)
    qp = torch.sort(torch.cat([torch.randperm(360, generator=torch.Generator().manual_seed(3))[:70],
                               torch.arange(390, 400)])).values  # 80 rows: 5 grains of 16
    cost = 900

    def price(cuts):
        return sum((b - a) * (int(qp[b - 1]) + 1) + cost for a, b in zip(cuts, cuts[1:]))
    grains = list(range(16, 80, 16))
    best = min(price([0, *inner, 80]) for n in range(len(grains) + 1) for inner in itertools.combinations(grains, n))
    blocks = query_blocks(qp, kp, call_cost=cost)
    assert price([0, *[b for _, b, _, _ in blocks]]) == best < 80 * 400 + cost
    assert query_blocks(qp, kp, call_cost=10**9) is None


def test_query_blocks_stay_short_over_many_rows():
    """The newest 2,000 rows after a 6,000-token head (an exact head read from the sequence tree): blocks of
    at most MAX_BLOCK_ROWS, found quickly, each up to its own last row."""
    import time

    from workers.attention import MAX_BLOCK_ROWS

    kp, qp = torch.arange(8000), torch.arange(6000, 8000)
    start = time.perf_counter()
    blocks = query_blocks(qp, kp)
    assert time.perf_counter() - start < 0.5  # generous: ~1 ms here (quadratic in the rows without the bound)
    assert blocks and max(b - a for a, b, _, _ in blocks) <= MAX_BLOCK_ROWS
    assert all(hi == 6000 + b for _, b, _, hi in blocks)


@pytest.mark.parametrize("path", PATHS)
def test_scattered_rows_attention_equals_the_masked_attention(path):
    torch.manual_seed(0)
    t = 600
    k, v, kp = torch.randn(3, t, 64), torch.randn(3, t, 64), torch.arange(t)
    qp = torch.cat([torch.sort(torch.randperm(t - 40)[:160]).values, torch.arange(t - 40, t)])  # selected + question
    q = torch.randn(9, qp.numel(), 64)
    assert query_blocks(qp, kp) is not None
    torch.testing.assert_close(_attend(path, q, k, v, qp, kp, 0.125), _masked(q, k, v, qp, kp, 0.125),
                               atol=1e-5, rtol=1e-4)
    held = torch.rand(3, t) > 0.3  # chunks compressed at ingest: per-head dropped entries (SDPA on both paths)
    held[:, 0] = True  # every query sees at least one entry
    torch.testing.assert_close(_attend(path, q, k, v, qp, kp, 0.125, held), _masked_heads(q, k, v, qp, kp, 0.125, held),
                               atol=1e-5, rtol=1e-4)


def test_blocked_attention_equals_the_masked_attention_in_bf16():
    """Blend's recomputed rows in the model dtype: the query blocks match one masked call within bf16 rounding."""
    torch.manual_seed(1)
    t = 1100
    k, v, kp = torch.randn(3, t, 64).bfloat16(), torch.randn(3, t, 64).bfloat16(), torch.arange(t)
    qp = torch.cat([torch.sort(torch.randperm(t - 50)[:250]).values, torch.arange(t - 50, t)])
    q = torch.randn(9, qp.numel(), 64).bfloat16()
    assert query_blocks(qp, kp) is not None
    out = attend(q, k, v, qp, kp, 0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _masked(q, k, v, qp, kp, 0.125).float(), atol=2e-2, rtol=2e-2)


def test_a_sliding_window_sees_only_its_last_window_positions():
    """Gemma 3's local layers: a query at p sees positions [p - window + 1, p], on every attention path."""
    qp, kp = torch.tensor([10, 11, 20]), torch.arange(21)
    mask = visibility_mask(qp, kp, None, 1, window=4)[0]
    assert mask[0].nonzero().flatten().tolist() == [7, 8, 9, 10]
    assert mask[2].nonzero().flatten().tolist() == [17, 18, 19, 20]
    torch.manual_seed(2)
    t, window = 700, 128
    k, v, kp = torch.randn(1, t, 64), torch.randn(1, t, 64), torch.arange(t)
    q = torch.randn(4, t, 64)
    assert causal_padding(kp, kp, window) is None  # the causal fast path has no window
    assert causal_padding(kp[:window], kp[:window], window) == 0  # unless the window covers the whole cache
    blocks = query_blocks(kp, kp, window=window)  # a full prefill: each block from its first query's window
    assert blocks is not None and all(lo == max(0, a - window + 1) for a, _, lo, _ in blocks)
    qp = torch.cat([torch.sort(torch.randperm(t - 40)[:160]).values, torch.arange(t - 40, t)])  # blend's rows
    for path in PATHS:
        torch.testing.assert_close(_attend(path, q, k, v, kp, kp, 0.125, window=window),
                                   _masked(q, k, v, kp, kp, 0.125, window), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(_attend(path, q[:, qp], k, v, qp, kp, 0.125, window=window),
                                   _masked(q[:, qp], k, v, qp, kp, 0.125, window), atol=1e-5, rtol=1e-4)
    # changing a key outside every query's window changes nothing
    k2 = k.clone()
    k2[:, :t - 64 - window] = 100.0
    torch.testing.assert_close(attend(q[:, -64:], k2, v, kp[-64:], kp, 0.125, window=window),
                               attend(q[:, -64:], k, v, kp[-64:], kp, 0.125, window=window))


def test_an_additive_mask_gives_the_bool_masks_result_bit_for_bit():
    """A plan's mask is what SDPA makes of a bool mask (0 where visible, -inf elsewhere), so a plan made once
    and run by many layers computes exactly what one masked call per layer computed."""
    torch.manual_seed(2)
    t = 300
    k, v, kp = torch.randn(3, t, 64), torch.randn(3, t, 64), torch.arange(t)
    qp = torch.sort(torch.randperm(t)[:16]).values  # one grain of rows: one masked call
    q = torch.randn(9, qp.numel(), 64)
    plan = plan_attention(qp, kp, None, 9, None, q.dtype, rows=False)
    assert plan.mask is not None and not plan.parts and plan.mask.dtype == q.dtype
    assert torch.equal(plan.run(q, k, v, 0.125), _masked(q, k, v, qp, kp, 0.125))
    held = torch.rand(3, t) > 0.3
    held[:, 0] = True
    assert torch.equal(plan_attention(qp, kp, held, 9, None, q.dtype).run(q, k, v, 0.125),
                       _masked_heads(q, k, v, qp, kp, 0.125, held))
    window = 50
    assert torch.equal(plan_attention(qp, kp, None, 9, window, q.dtype, rows=False).run(q, k, v, 0.125),
                       _masked(q, k, v, qp, kp, 0.125, window))


def test_a_plan_memo_shares_a_plan_only_between_the_same_positions():
    kp, qp = torch.arange(600), torch.arange(0, 600, 3)
    memo = PlanMemo()
    first = memo.plan(qp, kp, None, 9, None, torch.float32)
    assert memo.plan(qp, kp, None, 9, None, torch.float32) is first  # the next layer's
    assert memo.plan(qp.clone(), kp, None, 9, None, torch.float32) is not first  # other tensors, equal or not
    assert memo.plan(qp, kp, None, 9, 64, torch.float32) is not first  # a sliding-window layer
    held = torch.ones(3, 600, dtype=torch.bool)
    assert memo.plan(qp, kp, held, 9, None, torch.float32) is not memo.plan(qp, kp, held, 9, None, torch.float32)
    assert memo.plan(qp, kp, None, 9, None, torch.float32) is first  # still


def test_blend_with_shared_plans_equals_one_plan_per_layer(runner):
    """blend.recompute shares one attention plan between the layers of a pass: the logits are those of the
    same pass planning every layer on its own, bit for bit."""
    from workers.blend import BlendConfig
    from workers.modes import plan_for
    from workers.pipeline import HeldChunks, run_prefill
    from workers.prompt import build_prompt
    import workers.runner as runner_module

    chunks = [f"Note {i}: the depot at Kell {i} opened in {1900 + 7 * i} and keeps {i * 13} carts." for i in range(6)]
    layout = build_prompt(runner.tokenizer, "", [runner.tokenize(c) for c in chunks], "Which depot keeps 39 carts?")
    held = HeldChunks(runner.chunk_kv(layout.prefix_ids), [runner.chunk_kv(runner.tokenize(c)) for c in chunks])
    plan = plan_for("blend", BlendConfig(recompute_ratio=0.5))
    shared = run_prefill(runner, layout, plan, held)
    original = runner_module.PlanMemo.plan
    calls = []

    def fresh(self, *args):
        calls.append(1)
        return plan_attention(*args)
    runner_module.PlanMemo.plan = fresh
    try:
        alone = run_prefill(runner, layout, plan, held)
    finally:
        runner_module.PlanMemo.plan = original
    assert len(calls) == runner.shape.num_layers
    assert torch.equal(shared.logits, alone.logits)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(shared.cache.layers, alone.cache.layers))


@needs_rows
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 1, 256), (14, 2, 72), (16, 1, 32)])
def test_the_row_kernel_equals_the_masked_attention_for_any_head_layout(heads, kv_heads, dim):
    """SmolLM2 (3 queries a kv head), Gemma 3 270M (4 of 256), Qwen2.5-0.5B-like (7, a head size that is no
    multiple of 32) and more queries a kv head than a tile holds (16): the row kernel against one masked SDPA."""
    torch.manual_seed(heads)
    t = 333
    k, v, kp = torch.randn(kv_heads, t, dim), torch.randn(kv_heads, t, dim), torch.arange(t)
    qp = torch.cat([torch.sort(torch.randperm(t - 9)[:50]).values, torch.arange(t - 9, t)])
    q = torch.randn(heads, qp.numel(), dim)
    torch.testing.assert_close(_attend("rows", q, k, v, qp, kp, dim ** -0.5), _masked(q, k, v, qp, kp, dim ** -0.5),
                               atol=1e-5, rtol=1e-4)


@needs_rows
def test_a_row_attends_alike_whatever_rows_and_threads_it_is_computed_with():
    """Row invariance (row_attention.c): a row's output is the same bit for bit alone, among blend's scattered
    rows, among every row of the prompt, under a window, and on one thread or two."""
    torch.manual_seed(3)
    t = 700
    k, v, kp = torch.randn(3, t, 64), torch.randn(3, t, 64), torch.arange(t)
    q = torch.randn(9, t, 64)
    every = _attend("rows", q, k, v, kp, kp, 0.125)  # a full prefill
    qp = torch.sort(torch.randperm(t)[:123]).values  # blend's rows
    assert torch.equal(_attend("rows", q[:, qp], k, v, qp, kp, 0.125), every[qp])
    assert torch.equal(_attend("rows", q[:, qp[5:6]], k, v, qp[5:6], kp, 0.125), every[qp[5:6]])
    window = 100
    windowed = _attend("rows", q, k, v, kp, kp, 0.125, window=window)
    assert torch.equal(_attend("rows", q[:, qp], k, v, qp, kp, 0.125, window=window), windowed[qp])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(_attend("rows", q[:, qp], k, v, qp, kp, 0.125), every[qp])
    finally:
        torch.set_num_threads(threads)


@needs_rows
def test_the_row_kernel_reads_a_cache_view_with_its_own_head_stride():
    """The runner's cache is a view of a longer buffer: [Hkv, T, D] with a head stride over the capacity."""
    torch.manual_seed(4)
    buffer = torch.randn(2, 3, 500, 64)  # keys and values, capacity 500
    k, v, kp = buffer[0, :, :321], buffer[1, :, :321], torch.arange(321)
    qp = torch.arange(300, 321)
    q = torch.randn(9, qp.numel(), 64)
    torch.testing.assert_close(_attend("rows", q, k, v, qp, kp, 0.125), _masked(q, k, v, qp, kp, 0.125),
                               atol=1e-5, rtol=1e-4)


def test_the_row_kernel_is_planned_only_where_it_applies():
    kp, qp = torch.arange(100), torch.arange(50, 100)
    rows = row_attention.unavailable() is None
    assert (plan_attention(qp, kp, None, 9, None, torch.float32).ranges is not None) == rows
    assert plan_attention(qp, kp, None, 9, None, torch.bfloat16).ranges is None  # the model in bf16: SDPA
    assert plan_attention(qp, kp, torch.ones(3, 100, dtype=torch.bool), 9, None, torch.float32).ranges is None
    assert plan_attention(qp, kp[None].expand(3, -1), None, 9, None, torch.float32).ranges is None  # per head
    assert plan_attention(qp, kp.flip(0), None, 9, None, torch.float32).ranges is None  # not increasing
    assert plan_attention(torch.tensor([5, 60]), kp[10:], None, 9, None, torch.float32).ranges is None  # sees none


def test_a_machine_that_cannot_build_the_row_kernel_attends_with_sdpa(tmp_path):
    """No C compiler: the kernel says why, plans are SDPA's and attention still equals the masked one."""
    code = ("import torch; from workers import row_attention; from workers.attention import plan_attention;"
            "p = torch.arange(50); print(row_attention.unavailable(), '|',"
            "plan_attention(p, p, None, 9, None, torch.float32).ranges is None)")
    env = {**os.environ, "CC": "/bin/false", "RAGKV_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert "building row_attention.c failed" in out and out.strip().endswith("| True")


@needs_rows
def test_a_prebuilt_row_kernel_is_used_without_a_compiler(tmp_path):
    """The container images compile every C kernel in their build stage (`python -m workers.native`) and run
    without a compiler: a library already in a native dir is loaded, never rebuilt."""
    import shutil
    from workers import native
    built = native.build(row_attention.SOURCE, tmp_path / "build")
    (tmp_path / "cache" / "native").mkdir(parents=True)
    shutil.copy(built, tmp_path / "cache" / "native" / built.name)
    code = ("import torch; from workers import row_attention; from workers.attention import plan_attention;"
            "p = torch.arange(50); print(row_attention.unavailable(), '|',"
            "plan_attention(p, p, None, 9, None, torch.float32).ranges is not None)")
    env = {**os.environ, "CC": "/bin/false", "RAGKV_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.strip() == "None | True"


@needs_rows
def test_the_row_kernel_sums_a_long_range_in_blocks():
    """Uniform weights over 4,096 values of 1/3: the output is their mean. Summed one by one in fp32 the error
    grows with the range (4e-6 here, SDPA's as well); the kernel sums each 64-entry chunk from zero and adds
    chunk sums (row_attention.c), which keeps it at the last bits of 1/3."""
    t = 4096
    keys, values = torch.randn(3, t, 64), torch.full((3, t, 64), 1 / 3)
    q = torch.zeros(9, 1, 64)  # every score 0
    out = _attend("rows", q, keys, values, torch.tensor([t - 1]), torch.arange(t), 0.125)
    assert (out.double() - 1 / 3).abs().max() < 2e-7


def test_a_head_size_the_kernel_does_not_take_runs_its_row_ranges_under_sdpa():
    """A plan of row ranges (planned before the head size is known) over heads of 12: the ranges' mask, under SDPA,
    the same as the masked attention; the kernel itself refuses such heads."""
    torch.manual_seed(3)
    p = torch.arange(50)
    rows = torch.tensor([3, 17, 18, 40, 49])
    q, k, v = torch.randn(4, 5, 12), torch.randn(2, 50, 12), torch.randn(2, 50, 12)
    plan = plan_attention(rows, p, None, 4, None, torch.float32)
    assert plan.ranges is not None or row_attention.unavailable() is not None
    torch.testing.assert_close(plan.run(q, k, v, 0.3), _masked(q, k, v, rows, p, 0.3), atol=1e-6, rtol=1e-5)
    assert not row_attention.fits(4, 2, 12) and row_attention.fits(4, 2, 16) and not row_attention.fits(3, 2, 16)
    with pytest.raises(ValueError, match="multiple of 8"):  # refused before the library is needed
        row_attention.attend_rows(q, k, v, torch.zeros(5, dtype=torch.int32), rows.int() + 1, 0.3)


needs_bf16 = pytest.mark.skipif(not (row_attention.unavailable() is None and row_attention.bf16_fits(64)),
                                reason="the bf16 row kernel needs a CPU with AVX512-BF16")


def _bf16_rows(q, k, v, qp, kp, scale, window=None):
    plan = plan_attention(qp, kp, None, q.shape[0], window, q.dtype, bf16=True)
    assert plan.ranges is not None and plan.bf16
    return plan.run(q, k, v, scale)


def _reference(q, k, v, qp, kp, scale, window=None, rounded=False):
    """Masked attention in fp64; `rounded`: of the queries (scaled), keys and values rounded to bf16 first."""
    bf = (lambda x: x.to(torch.bfloat16).double()) if rounded else (lambda x: x.double())
    mask = visibility_mask(qp, kp, None, q.shape[0], window)[None]
    out = F.scaled_dot_product_attention(bf(q * scale)[None], bf(k)[None], bf(v)[None], attn_mask=mask, scale=1.0,
                                         enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[1], -1)


@needs_bf16
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 1, 256), (8, 2, 48), (16, 1, 32)])
def test_the_bf16_row_kernel_is_the_attention_of_bf16_operands(heads, kv_heads, dim):
    """bf16 arithmetic (row_attention.c): against fp64 attention of the same bf16-rounded queries, keys and values
    it differs only by the softmax weights' own rounding to bf16 (relative 2^-9), and against the exact fp32 row
    kernel by what bf16 operands cost. Scattered rows, a window, a span that is no multiple of 16 (or 2), every
    head layout the kernel takes (dim a multiple of 16)."""
    torch.manual_seed(dim)
    t = 333
    k, v, kp = torch.randn(kv_heads, t, dim) * 2, torch.randn(kv_heads, t, dim), torch.arange(t)
    qp = torch.cat([torch.sort(torch.randperm(t - 9)[:50]).values, torch.arange(t - 9, t)])
    q = torch.randn(heads, qp.numel(), dim)
    scale = dim ** -0.5
    for window in (None, 100):
        out = _bf16_rows(q, k, v, qp, kp, scale, window).double()
        operands = (out - _reference(q, k, v, qp, kp, scale, window, rounded=True)).abs()
        exact = (out - _reference(q, k, v, qp, kp, scale, window)).abs()
        assert operands.max() < 1e-2 and operands.mean() < 1e-3, (operands.max(), operands.mean())
        assert exact.max() < 5e-2 and exact.mean() < 5e-3, (exact.max(), exact.mean())
        assert operands.mean() < exact.mean()  # the operands' rounding is most of the difference


@needs_bf16
def test_a_row_attends_alike_in_bf16_whatever_rows_and_threads_it_is_computed_with():
    """Row invariance holds for the bf16 arithmetic too: blend's recomputed rows attend bit for bit as the same rows
    of a full prefill over the same cache."""
    torch.manual_seed(5)
    t = 700
    k, v, kp = torch.randn(3, t, 64), torch.randn(3, t, 64), torch.arange(t)
    q = torch.randn(9, t, 64)
    every = _bf16_rows(q, k, v, kp, kp, 0.125)
    qp = torch.sort(torch.randperm(t)[:123]).values
    assert torch.equal(_bf16_rows(q[:, qp], k, v, qp, kp, 0.125), every[qp])
    assert torch.equal(_bf16_rows(q[:, qp[5:6]], k, v, qp[5:6], kp, 0.125), every[qp[5:6]])
    windowed = _bf16_rows(q, k, v, kp, kp, 0.125, window=100)
    assert torch.equal(_bf16_rows(q[:, qp], k, v, qp, kp, 0.125, window=100), windowed[qp])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(_bf16_rows(q[:, qp], k, v, qp, kp, 0.125), every[qp])
    finally:
        torch.set_num_threads(threads)


@needs_rows
def test_bf16_attention_falls_back_to_fp32_where_it_cannot_run():
    """A head size that is no multiple of 16 (or a CPU without AVX512-BF16) runs a bf16 plan in fp32, exactly; the
    kernel itself refuses it."""
    torch.manual_seed(6)
    k, v, kp = torch.randn(3, 90, 24), torch.randn(3, 90, 24), torch.arange(90)
    q = torch.randn(9, 40, 24)
    qp = kp[50:]
    assert not row_attention.bf16_fits(24)
    plan = plan_attention(qp, kp, None, 9, None, torch.float32, bf16=True)
    assert torch.equal(plan.run(q, k, v, 0.2), _attend("rows", q, k, v, qp, kp, 0.2))
    with pytest.raises(ValueError, match="multiple of 16"):
        row_attention.attend_rows(q, k, v, *plan.ranges, 0.2, bf16=True)


def test_a_memo_keeps_fp32_and_bf16_plans_apart():
    memo, p = PlanMemo(), torch.arange(64)
    exact, low = (memo.plan(p, p, None, 9, None, torch.float32, bf16) for bf16 in (False, True))
    assert not exact.bf16 and low.bf16 == (low.ranges is not None)
    assert memo.plan(p, p, None, 9, None, torch.float32, True) is low
