"""Continuous batching (workers/batching): kernels, the batched decode step, the scheduler through the engine.

The property everything rests on: a request's greedy tokens are the same in a batch as alone.
"""

from __future__ import annotations

import threading

import pytest
import torch

from workers.batching.linear import DECODE_KERNELS, pack_int4, q4_groups
from workers.batching.scheduler import BatchConfig
from workers.batching.layer import decode_layer_eager
from workers.batching.step import decode_step, rope_matrix
from workers.cache import KVCache, LayerKV
from workers.engine import Engine, EngineConfig
from workers.errors import Cancelled, ResourceExhausted
from workers.eviction.slots import keep_slots, pack_heads, unpack_heads
from workers.requests import CompressionSpec, GenerateRequest
from kvstore.rope import apply_rope, rope_cos_sin

# these tests compare answers over the same chunks run twice: an idle-time exact prefill of a blended prompt
# (workers/sequences.py) would make the second exact; tests/workers/test_sequences.py covers that
SEQ = False

CHUNKS = [
    "The capital of Frobnia is Lindorf. Lindorf was founded in 1432 by the salt merchant Osric Vale.",
    "Zorblat is a cold planet with two moons, Tiv and Rel, and oceans of liquid methane.",
    "Brightwell Robotics makes greenhouse robots; its chief executive is Lorna Featherstone.",
    "The Quillon river runs 840 kilometres from the Ashen hills to the port of Maravel.",
]


def _clone(cache: KVCache) -> KVCache:
    return KVCache([LayerKV(l.keys.clone(), l.values.clone(), l.positions.clone()) for l in cache.layers])


@pytest.fixture(scope="module")
def prefilled(runner):
    """A 40-token cache and the first greedy token after it."""
    ids = torch.tensor(runner.tokenize(" ".join(CHUNKS))[:40])
    cache = KVCache.empty(runner.shape.num_layers)
    logits = runner.forward(ids, torch.arange(len(ids)), cache)
    return cache, int(logits.argmax()), len(ids)


# -- kernels ---------------------------------------------------------------------------
def test_default_model_weights_are_exact_4bit_groups(runner):
    """The GGUF Q4_1 weights come back exactly (codes * d + m == the fp32 matrix), so int4 packs them all."""
    attn = runner.layers[0].self_attn
    codes, d, m = q4_groups(attn.q_proj.weight.detach())
    rebuilt = (codes.float().view(codes.shape[0], -1, 32) * d[..., None] + m[..., None]).reshape(codes.shape)
    assert torch.equal(rebuilt, attn.q_proj.weight.detach())
    assert pack_int4(runner.model.lm_head.weight.detach()) is not None  # the Q8_0 embedding, as two nibbles
    assert runner.decode_weights("int4", 4).kernels_used() == {"int4": 1 + 4 * runner.shape.num_layers}
    assert q4_groups(torch.randn(8, 64)) is None and pack_int4(torch.randn(8, 64)) is None  # not 4-bit: refused


@pytest.mark.parametrize("kernel", sorted(DECODE_KERNELS))
def test_kernels_are_batch_invariant(runner, kernel):
    """Row i of a batch has the same bits as row i alone, whatever the other rows hold."""
    layer = runner.decode_weights(kernel, 8).layers[3]
    x = torch.randn(8, runner.shape.hidden_size)
    for linear in (layer.qkv, layer.gate_up):
        batched = linear(x)
        assert all(torch.equal(linear(x[i:i + 1])[0], batched[i]) for i in range(8))


def test_rope_matrix_equals_rope(runner):
    pos = torch.tensor([0, 7, 513])
    x = torch.randn(4, 3, runner.shape.head_dim)  # [H, B, D]
    cos, sin = rope_cos_sin(pos, runner.inv_freq)
    by_matrix = torch.bmm(x.transpose(0, 1), rope_matrix(pos, runner.inv_freq)).transpose(0, 1)
    assert torch.allclose(by_matrix, apply_rope(x, cos, sin), atol=1e-5)


# -- the decode step -------------------------------------------------------------------
def test_fp32_step_equals_the_runner_forward(runner, prefilled):
    cache, token, n = prefilled
    ref = runner.forward(torch.tensor([token]), torch.tensor([n]), _clone(cache))
    out = decode_step(runner, runner.decode_weights("fp32", 4), [token], [n], [_clone(cache)])
    assert torch.allclose(out, ref, atol=1e-3) and int(out.argmax()) == int(ref.argmax())


@pytest.mark.parametrize("kernel", sorted(DECODE_KERNELS))
def test_step_row_is_the_same_alone_and_in_a_batch(runner, prefilled, kernel):
    cache, token, n = prefilled
    weights = runner.decode_weights(kernel, 4)
    alone = decode_step(runner, weights, [token], [n], [_clone(cache)])
    short = _clone(cache)  # a shorter, different cache in the same batch
    for layer in short.layers:
        layer.keys, layer.values, layer.positions = layer.keys[:, :9], layer.values[:, :9], layer.positions[:9]
    batch = decode_step(runner, weights, [token, 17, 99], [n, 9, n], [_clone(cache), short, _clone(cache)])
    assert torch.equal(batch[0], alone[0])
    assert not torch.equal(batch[1], alone[0])  # the other rows really were different requests


@pytest.mark.parametrize("kernel", sorted(DECODE_KERNELS))
def test_scripted_layer_equals_the_eager_source(runner, prefilled, kernel):
    """decode_layer is TorchScript's compile of decode_layer_eager: same logits, same cache writes."""
    cache, token, n = prefilled
    weights = runner.decode_weights(kernel, 4)
    scripted, eager = [_clone(cache), _clone(cache)], [_clone(cache), _clone(cache)]
    for step in range(2):
        a = decode_step(runner, weights, [token + step, 17], [n + step, n], scripted)
        b = decode_step(runner, weights, [token + step, 17], [n + step, n], eager, layer_fn=decode_layer_eager)
        assert torch.equal(a, b)
    assert all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
               for c, d in zip(scripted, eager) for x, y in zip(c.layers, d.layers))


def test_cache_grows_in_place_and_never_into_a_shared_buffer():
    layer = LayerKV(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.arange(3))
    layer.append(torch.ones(2, 1, 4), torch.ones(2, 1, 4), torch.tensor([3]))
    buffer = layer.keys.data_ptr()
    for step in range(5):
        layer.append(torch.full((2, 1, 4), step + 2.0), torch.ones(2, 1, 4), torch.tensor([4 + step]))
    assert layer.keys.data_ptr() == buffer  # written in place, no copy of the layer per token
    assert layer.keys.shape == (2, 9, 4) and layer.positions.tolist() == list(range(9))
    assert layer.keys[0, :, 0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6]
    view = LayerKV(layer.keys, layer.values, layer.positions)  # another layer over the same tensors
    view.append(torch.full((2, 1, 4), -1.0), torch.ones(2, 1, 4), torch.tensor([9]))
    layer.append(torch.full((2, 1, 4), 7.0), torch.ones(2, 1, 4), torch.tensor([9]))
    assert view.keys[0, -1, 0] == -1 and layer.keys[0, -1, 0] == 7  # neither wrote into the other's room


@pytest.mark.parametrize("kernel,atol", [("fp32", 1e-4), ("avx2", 0.02)])  # avx2: its C attention reads both
def test_packed_heads_step_equals_the_padded_layout(runner, prefilled, kernel, atol):
    """Heads keeping unequal counts: the packed layer holds exactly the kept entries, and a decode step
    (and the runner's attention) over it gives the padded layer's logits. avx2's tolerance is its step's
    against fp32 (test_avx2.py): its activations are quantized, so a different summation order can move
    a code by one; a head reading another head's entries moves logits by far more."""
    cache, token, n = prefilled
    gen = torch.Generator().manual_seed(0)
    heads = runner.shape.num_kv_heads
    padded, packed = [], []
    for layer in cache.layers:
        keep = torch.rand(heads, n, generator=gen) < torch.linspace(0.3, 0.9, heads)[:, None]
        keep[:, :4] = True
        kv = keep_slots(LayerKV(layer.keys.clone(), layer.values.clone(), layer.positions.clone()), keep)[0]
        padded.append(kv)
        packed.append(pack_heads(kv))
        assert packed[-1].packed and packed[-1].keys.shape == (1, int(keep.sum()), runner.shape.head_dim)
        assert packed[-1].head_length == kv.num_tokens == int(keep.sum(1).max())
        back = unpack_heads(packed[-1])
        assert torch.equal(back.keys, kv.keys) and torch.equal(back.positions, kv.positions)
        assert torch.equal(back.head_mask, kv.head_mask)
    padded_cache, packed_cache = KVCache(padded), KVCache(packed)
    assert packed_cache.nbytes() < 0.8 * padded_cache.nbytes()
    weights = runner.decode_weights(kernel, 4)
    for step in range(3):  # appends: one entry per kv head and token in the packed layer
        want = decode_step(runner, weights, [token + step], [n + step], [padded_cache])
        got = decode_step(runner, weights, [token + step], [n + step], [packed_cache])
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)
    assert all(kv.head_length == p.num_tokens for kv, p in zip(packed_cache.layers, padded_cache.layers))
    want = runner.forward(torch.tensor([5, 6]), torch.tensor([n + 3, n + 4]), padded_cache)
    got = runner.forward(torch.tensor([5, 6]), torch.tensor([n + 3, n + 4]), packed_cache)
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)  # over the entries those steps wrote


# -- the scheduler, through the engine ---------------------------------------------------
def _engine(runner, tmp_path, prefill_kernel: str = EngineConfig.prefill_kernel, **batch) -> Engine:
    return Engine(EngineConfig(store=f"disk:{tmp_path / 'blocks'}", batch=BatchConfig(**batch), sequence_cache=SEQ,
                               prefill_kernel=prefill_kernel), runner=runner)


def _concurrently(engine: Engine, requests: list[GenerateRequest]) -> list:
    out: list = [None] * len(requests)

    def go(i: int) -> None:
        try:
            out[i] = engine.generate(requests[i])
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out[i] = e

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


MIXED = [
    GenerateRequest(question="Who founded Lindorf?", chunks=CHUNKS, mode="full", max_new_tokens=10),
    GenerateRequest(question="Name the moons of Zorblat.", chunks=CHUNKS[1:3], mode="blend", max_new_tokens=14),
    GenerateRequest(question="Who runs Brightwell?", chunks=CHUNKS, mode="reuse", max_new_tokens=6),
    GenerateRequest(question="How long is the Quillon?", chunks=CHUNKS, mode="prefix", max_new_tokens=12,
                    compression=CompressionSpec(policy="tova", budget=0.5)),
    GenerateRequest(question="Tell me about Lindorf.", chunks=CHUNKS[:2], mode="blend", max_new_tokens=12,
                    temperature=0.8, top_p=0.9, seed=7),
    GenerateRequest(question="Where does the Quillon end?", chunks=CHUNKS, mode="blend", max_new_tokens=8,
                    compression=CompressionSpec(policy="snapkv", budget=0.4)),
    GenerateRequest(question="Who founded Lindorf?", chunks=CHUNKS[:3], mode="full", max_new_tokens=6,
                    compression=CompressionSpec(policy="adakv", budget=0.5)),  # heads packed (unequal counts)
]


def test_mixed_batch_equals_each_request_alone(runner, tmp_path):
    """Modes, lengths, eviction policies and a sampling seed in one batch: token for token as alone."""
    engine = _engine(runner, tmp_path, max_batch=len(MIXED))
    try:
        alone = [engine.generate(r).token_ids for r in MIXED]
        before = engine.scheduler.stats.decode_steps
        batched = _concurrently(engine, MIXED)
        assert [r.token_ids for r in batched] == alone
        assert batched[-1].stats["compression"]["packed"]  # adakv's unequal heads ran packed in the batch
        stats = engine.stats().batch
        assert stats.decode_steps > before and stats.prefills == 2 * len(MIXED)
        # the batch really formed: fewer decode steps than the tokens it produced
        assert stats.decode_steps - before < sum(len(t) for t in alone)
    finally:
        engine.close()


def test_fp32_full_in_a_batch_equals_transformers_generate(runner, tmp_path):
    """The exact kernels (fp32 prefill, fp32 decode) give transformers' own greedy tokens."""
    engine = _engine(runner, tmp_path, max_batch=3, decode_kernel="fp32", prefill_kernel="fp32")
    try:
        reqs = [GenerateRequest(question=q, chunks=CHUNKS, mode="full", max_new_tokens=10)
                for q in ("Who founded Lindorf?", "What is Zorblat?", "Who runs Brightwell?")]
        results = _concurrently(engine, reqs)
        for result in results:
            ids = torch.tensor(result.prompt_token_ids)[None]
            with torch.inference_mode():
                ref = runner.model.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:].tolist()
            assert result.token_ids == [t for t in ref if t not in runner.stop_token_ids]
    finally:
        engine.close()


def test_cancelled_request_leaves_the_batch_and_the_others_finish(runner, tmp_path):
    engine = _engine(runner, tmp_path, max_batch=2)
    try:
        keep = GenerateRequest(question="Who founded Lindorf?", chunks=CHUNKS, mode="blend", max_new_tokens=12)
        expected = engine.generate(keep).token_ids
        stop = threading.Event()
        long = GenerateRequest(question="Write a long essay about Zorblat.", chunks=CHUNKS, mode="blend",
                               max_new_tokens=400)
        outcome: dict = {}

        def cancelled_one() -> None:
            pieces = 0
            try:
                for _ in engine.generate_stream(long, should_stop=stop.is_set):
                    pieces += 1
                    if pieces == 3:
                        stop.set()
            except Cancelled:
                outcome["cancelled_after"] = pieces

        t = threading.Thread(target=cancelled_one)
        t.start()
        assert engine.generate(keep).token_ids == expected
        t.join(120)
        assert 3 <= outcome["cancelled_after"] < 400
        assert engine.scheduler.running == [] and not engine.scheduler.waiting
    finally:
        engine.close()


def test_token_budget_admits_one_at_a_time_and_a_full_queue_refuses(runner, tmp_path):
    reqs = [GenerateRequest(question=f"Question {i}: who founded Lindorf?", chunks=CHUNKS, mode="reuse",
                            max_new_tokens=6) for i in range(3)]
    for budget, batched in ((50, False), (None, True)):  # 50: below one request's KV tokens
        engine = _engine(runner, tmp_path, max_batch=3, max_batch_tokens=budget)
        try:
            steps = engine.scheduler.stats.decode_steps
            alone = [engine.generate(r).token_ids for r in reqs]
            steps_alone, steps = engine.scheduler.stats.decode_steps - steps, engine.scheduler.stats.decode_steps
            results = _concurrently(engine, reqs)
            assert [r.token_ids for r in results] == alone
            steps_together = engine.scheduler.stats.decode_steps - steps
            # the budget holds them to one at a time (as many steps as alone); without it they share steps
            assert (steps_together < steps_alone) == batched, (budget, steps_together, steps_alone)
        finally:
            engine.close()
    engine = _engine(runner, tmp_path, max_batch=1, max_waiting=0)
    try:
        results = _concurrently(engine, [GenerateRequest(question="Write a long story.", chunks=CHUNKS[:1],
                                                         mode="full", max_new_tokens=40)] * 3)
        refused = [r for r in results if isinstance(r, ResourceExhausted)]
        assert refused and "queue is full" in str(refused[0])
        assert any(not isinstance(r, Exception) for r in results)
    finally:
        engine.close()


def test_bad_batch_settings_name_the_flag():
    for kwargs, flag in (({"max_batch": 0}, "--max-batch"), ({"max_batch_tokens": 0}, "--max-batch-tokens"),
                         ({"decode_kernel": "int3"}, "--decode-kernel")):
        with pytest.raises(ValueError, match=flag):
            BatchConfig(**kwargs)


def test_all_model_work_runs_on_the_scheduler_thread(runner, tmp_path):
    """Ingest's chunk compute goes through Scheduler.call: one thread owns torch's OpenMP pool."""
    from workers.batching.scheduler import Scheduler

    scheduler = Scheduler(BatchConfig(), prefill=lambda seq: None, decode=lambda seqs: None)
    try:
        assert scheduler.call(lambda: threading.current_thread().name) == "ragkv-scheduler"
        with pytest.raises(ZeroDivisionError):
            scheduler.call(lambda: 1 / 0)  # the caller gets the error, the loop goes on
        assert scheduler.call(lambda: 2 + 2) == 4
    finally:
        scheduler.close()
    driven = Scheduler(BatchConfig(), prefill=lambda seq: None, decode=lambda seqs: None)
    until, seen = threading.Event(), []

    def caller() -> None:
        seen.append(driven.call(threading.current_thread))
        until.set()

    assert driven.claim()  # before any call can start a thread of its own
    threading.Thread(target=caller).start()
    driven.run(until)  # this thread drives the loop (as `ragkv serve`'s main thread does)
    assert seen == [threading.current_thread()]
    engine = _engine(runner, tmp_path)
    try:
        engine.ingest(CHUNKS[:1])
        assert engine.stats().batch.steps >= 1  # the compute was a task of the scheduler's loop
    finally:
        engine.close()


def test_grow_adds_one_decode_token_in_place_or_declines():
    """LayerKV.grow, the avx2 step's fast path: in place with the same buffer; False, with nothing changed,
    where only reserve can add the token (no room of its own yet, a head mask, another dtype)."""
    layer = LayerKV(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.arange(3))
    assert not layer.grow(3, torch.float32) and layer.num_tokens == 3  # over tensors it did not allocate
    layer.append(torch.ones(2, 1, 4), torch.ones(2, 1, 4), torch.tensor([3]))
    buffer = layer.keys.data_ptr()
    assert layer.grow(10, torch.float32)
    assert layer.keys.data_ptr() == buffer and layer.num_tokens == 5 and layer.positions.tolist() == [0, 1, 2, 3, 10]
    assert layer.values.shape == (2, 5, 4)
    assert not layer.grow(11, torch.float64) and layer.num_tokens == 5  # another dtype: reserve promotes
    masked = LayerKV(layer.keys.clone(), layer.values.clone(), layer.positions.clone(), torch.ones(2, 5, dtype=torch.bool))
    masked.append(torch.ones(2, 1, 4), torch.ones(2, 1, 4), torch.tensor([11]))
    assert not masked.grow(12, torch.float32) and masked.num_tokens == 6  # the head mask must grow too


def _layers(count: int, tokens: int, seed: int) -> list[LayerKV]:
    gen = torch.Generator().manual_seed(seed)
    positions = torch.arange(tokens)
    return [LayerKV(torch.randn(2, tokens, 4, generator=gen), torch.randn(2, tokens, 4, generator=gen), positions)
            for _ in range(count)]


def test_cache_grows_every_layer_at_once_as_each_layer_would():
    """KVCache.grow, the avx2 step's path: every layer gains the same slot LayerKV.grow / reserve would give it,
    over one buffer, across the point where the buffer runs out of room (GROWTH_TOKENS) and is copied once."""
    together, alone = KVCache(_layers(3, 5, 0)), KVCache(_layers(3, 5, 0))
    for step in range(300):
        position = 5 + 2 * step  # any positions: grow takes what it is given
        assert together.grow(position, torch.float32)
        for layer in alone.layers:
            if not layer.grow(position, torch.float32):
                layer.reserve(torch.tensor([position]), torch.float32, torch.float32)
        for i, (a, b) in enumerate(zip(together.layers, alone.layers)):
            for x in (a.keys[:, -1], b.keys[:, -1]):
                x.fill_(step + i)  # the caller's write of the new entry
            a.values[:, -1], b.values[:, -1] = -step, -step
    for a, b in zip(together.layers, alone.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and torch.equal(a.positions, b.positions)
    storages = {layer.keys.untyped_storage().data_ptr() for layer in together.layers}
    assert len(storages) == 1 and together.layers[0].num_tokens == 305  # one buffer for every layer


def test_cache_grow_declines_once_a_layer_is_replaced_or_cannot_share():
    """A layer replaced (eviction keeps a subset) or grown on its own: the cache stops growing together, and each
    layer grows by itself from then on without writing into the others. Layers of different lengths, a head mask
    or another dtype never grow together."""
    cache = KVCache(_layers(3, 5, 1))
    assert cache.grow(5, torch.float32)
    kept = cache.layers[1]
    cache.layers[1] = LayerKV(kept.keys[:, 2:].clone(), kept.values[:, 2:].clone(), kept.positions[2:].clone())
    assert not cache.grow(6, torch.float32) and cache.layers[0].num_tokens == 6  # nothing changed
    before = [layer.keys.clone() for layer in cache.layers]
    for layer in cache.layers:
        key_slot, _ = layer.reserve(torch.tensor([6]), torch.float32, torch.float32)
        key_slot.fill_(9.0)
    assert [layer.num_tokens for layer in cache.layers] == [7, 5, 7]
    assert all(torch.equal(layer.keys[:, :-1], old) for layer, old in zip(cache.layers, before))
    assert not cache.grow(7, torch.float32)  # for good
    uneven = KVCache(_layers(2, 5, 2) + _layers(1, 4, 3))
    masked = KVCache(_layers(2, 5, 4))
    masked.layers[0].head_mask = torch.ones(2, 5, dtype=torch.bool)
    assert not uneven.grow(5, torch.float32) and not masked.grow(5, torch.float32)
    assert not KVCache(_layers(2, 5, 5)).grow(5, torch.float64)  # the decode writes another dtype


def test_avx2_step_growing_every_layer_at_once_equals_each_layer_on_its_own(runner, prefilled):
    """The same tokens and bits as the per-layer path (a head mask that hides nothing makes each layer grow on its
    own): the stack changes where entries live, not what the step computes."""
    cache, token, n = prefilled
    weights = runner.decode_weights("avx2", 4)
    together = _clone(cache)
    alone = KVCache([LayerKV(l.keys.clone(), l.values.clone(), l.positions.clone(),
                             torch.ones(l.keys.shape[:2], dtype=torch.bool)) for l in cache.layers])
    tokens = [token, token]
    for step in range(12):
        a = decode_step(runner, weights, [tokens[0]], [n + step], [together])
        b = decode_step(runner, weights, [tokens[1]], [n + step], [alone])
        assert torch.equal(a, b)
        tokens = [int(a.argmax()), int(b.argmax())]
    assert all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(together.layers, alone.layers))
