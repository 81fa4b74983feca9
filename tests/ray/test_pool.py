"""Worker actors over a real local Ray and a real redis-server."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from kvstore.backends.registry import open_backend
from kvstore.codecs import DEFAULT_CODEC
from workers.key_plan import codec_for_model
from kvstore.store import BlockStore
from workers.chunk_forms import chunk_fingerprint
from workers import precompute
from workers.chunking import chunk_text
from workers.engine import Engine, EngineConfig
from workers.requests import GenerateRequest

# these tests compare answers over the same chunks run twice: an idle-time exact prefill of a blended prompt
# (workers/sequences.py) would make the second exact; tests/workers/test_sequences.py covers that
SEQ = False

pytestmark = pytest.mark.timeout(300)

DOCS = [
    "The Rhine rises in the Swiss Alps and flows north through Germany and the Netherlands into the North Sea. "
    "It has been a vital trade route since Roman times, and castles line its middle valley.",
    "Photosynthesis converts light energy into chemical energy. Chlorophyll absorbs mostly blue and red light, "
    "which is why leaves look green. The Calvin cycle fixes carbon dioxide into sugars.",
    "The passkey for the vault is 48213. Remember it: the guard will ask for the passkey at the gate, "
    "and nobody gets in without it. The vault holds the archive of the old observatory.",
]


def write_corpus(root, docs=DOCS):
    root.mkdir(exist_ok=True)
    (root / "a.txt").write_text(docs[0])
    (root / "b.jsonl").write_text("\n".join('{"text": %s}' % __import__("json").dumps(d) for d in docs[1:]) + "\n")
    return root


def incrby_calls(url: str) -> int:
    """Block puts so far: RedisBackend.put_many issues exactly one INCRBY per put."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return stats.get("cmdstat_incrby", {}).get("calls", 0)


def store_for(url, runner, codec=DEFAULT_CODEC):  # what the engine and the actors store with
    fingerprint = runner.with_kernel(EngineConfig.prefill_kernel).kv_fingerprint
    return BlockStore(open_backend(url), codec_for_model(codec, runner), chunk_fingerprint(fingerprint, runner.tokenizer))


def test_chunk_ids_equal_engine_ingest_ids(runner, redis_url):
    chunks = chunk_text(runner.tokenizer, " ".join(DOCS), chunk_tokens=32)
    assert len(chunks) >= 3
    store = store_for(redis_url, runner)
    ids = [store.address_for(runner.tokenize(c)) for c in chunks]
    engine = Engine(EngineConfig(store=redis_url, memory_budget_bytes=None, sequence_cache=SEQ), runner)
    assert [r.id for r in engine.ingest(chunks)] == ids


def test_chunk_ingested_on_a_is_blended_on_b_from_redis(pool, redis_url, runner):
    text = DOCS[2]
    [row] = pool.call_on(0, "ingest", [text])
    assert row["outcome"] == "computed"
    # a ratio that blends (the server's default ratio is served exactly, reading no chunk)
    request = GenerateRequest(question="What is the passkey?", chunks=(text,), max_new_tokens=16, recompute_ratio=0.15)
    result = pool.call_on(1, "generate", request)
    assert result.stats["chunks_hit"] == 1 and result.stats["chunks_computed"] == 0
    # B's answer from A's block is the answer of an engine in this process reading the same block
    local = Engine(EngineConfig(store=redis_url, memory_budget_bytes=None, sequence_cache=SEQ), runner).generate(request)
    assert local.stats["chunks_hit"] == 1 and local.token_ids == result.token_ids
    by_id = pool.call_on(1, "generate", GenerateRequest(question="What is the passkey?", chunks=(row["id"],),
                                                       max_new_tokens=16))
    assert by_id.token_ids == result.token_ids


def test_single_flight_same_chunk_on_two_actors_computes_once(pool, redis_url, runner):
    token_ids = runner.tokenize(DOCS[0] + " " + DOCS[1])
    redis.Redis.from_url(redis_url).config_resetstat()
    refs = [pool.actors[i].compute.remote([token_ids]) for i in (0, 1)]
    outcomes = sorted(r[0]["outcome"] for r in __import__("ray").get(refs, timeout=120))
    assert outcomes in (["computed", "waited"], ["computed", "stored"])
    assert incrby_calls(redis_url) == 1


def test_worker_killed_mid_job_restarts_and_every_chunk_stored_once(pool, redis_url, runner):
    import ray

    chunks = chunk_text(runner.tokenizer, " ".join(DOCS * 2) + " " + " ".join(reversed(DOCS)), chunk_tokens=16)
    token_lists = list({tuple(runner.tokenize(c)): None for c in chunks})
    assert len(token_lists) >= 12
    pid_before = pool.call_on(0, "ping")["pid"]
    redis.Redis.from_url(redis_url).config_resetstat()
    killed = threading.Event()

    def kill_first(_batch, _rows):
        if not killed.is_set():
            killed.set()
            ray.kill(pool.actors[0], no_restart=False)

    batches = [([list(t) for t in token_lists[i:i + 2]], "") for i in range(0, len(token_lists), 2)]
    rows = [r for part in pool.map("compute", batches, on_result=kill_first) for r in part]
    assert killed.is_set()
    assert len(rows) == len(token_lists)
    store = store_for(redis_url, runner)
    ids = {store.address_for(list(t)) for t in token_lists}
    assert {r["id"] for r in rows} == ids
    assert incrby_calls(redis_url) == len(ids)  # each block written exactly once
    assert store.backend.stats()["blocks"] == len(ids)
    for address, tokens in zip([store.address_for(list(t)) for t in token_lists], token_lists):
        assert store.get(address, list(tokens)) is not None  # decodes: no partial block
    assert store.counters.corrupt == 0
    assert pool.call_on(0, "ping", timeout=180)["pid"] != pid_before  # restarted by Ray


def test_precompute_twice_stores_nothing_the_second_time_and_ids_match_engine(pool, redis_url, runner, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    first = precompute.run(str(corpus), redis_url, chunk_tokens=64, progress=False, pool=pool)
    assert first.documents == 3 and first.chunks >= 3
    assert first.computed + first.waited == first.chunks and first.skipped == 0
    assert first.bytes > 0 and first.tokens > 0
    puts = incrby_calls(redis_url)
    second = precompute.run(str(corpus), redis_url, chunk_tokens=64, progress=False, pool=pool)
    assert second.computed == 0 and second.skipped == first.chunks
    assert incrby_calls(redis_url) == puts

    texts = [t for doc in DOCS for t in chunk_text(runner.tokenizer, doc, 64)]
    engine = Engine(EngineConfig(store=redis_url, memory_budget_bytes=None, sequence_cache=SEQ), runner)
    refs = engine.ingest(texts)
    assert all(r.cached for r in refs)  # every id the engine computes was written by the batch job
    assert {r.id for r in refs} == set(store_for(redis_url, runner).backend.keys())  # the very same ids


def test_ray_engine_has_engine_surface(pool, redis_url):
    from workers.ray_pool import RayEngine

    engine = RayEngine(EngineConfig(store=pool.config.store, workers="ray"), pool)
    refs = engine.ingest([DOCS[0], DOCS[1]])
    assert engine.lookup([r.id for r in refs]) == [True, True]
    pieces = list(engine.generate_stream(GenerateRequest(question="Where does the Rhine rise?", chunks=(refs[0].id,),
                                                         max_new_tokens=6, recompute_ratio=0.15)))
    assert pieces[-1].stats["chunks_hit"] == 1 and "".join(pieces[:-1]) == pieces[-1].text
    from ragkv.errors import NotFound

    with pytest.raises(NotFound):
        engine.generate(GenerateRequest(question="q", chunks=("0" * 64,)))
    assert engine.stats()["workers"]["count"] == 2


def _share_pool(monkeypatch, pool, config):
    from workers import ray_pool

    monkeypatch.setitem(ray_pool._POOLS, (config.workers, config.model, config.store, config.codec), pool)


def test_engine_hook_sends_chunk_misses_to_the_pool(pool, redis_url, runner, monkeypatch):
    config = EngineConfig(store=pool.config.store, workers="ray", memory_budget_bytes=None)
    _share_pool(monkeypatch, pool, config)
    from workers.ray_pool import pool_for

    engine = Engine(config, runner, chunk_compute=pool_for(config))  # the strategy is injected, not imported
    computed = lambda: sum(s["worker"]["computed"] for s in pool.stats())  # noqa: E731
    before = computed()
    [ref] = engine.ingest([DOCS[1] + " Extra sentence."])
    assert not ref.cached and computed() == before + 1
    result = engine.generate(GenerateRequest(question="Why are leaves green?", chunks=(DOCS[0] + " More.",),
                                             max_new_tokens=4, recompute_ratio=0.15))  # blended: the miss computed
    assert result.stats["chunks_computed"] == 1 and computed() == before + 2


def test_make_engine_picks_by_config(pool, runner, monkeypatch):
    from workers.ray_pool import RayEngine, make_engine

    assert type(make_engine(EngineConfig(store="memory:"), runner)) is Engine
    config = EngineConfig(store=pool.config.store, workers="auto")
    _share_pool(monkeypatch, pool, config)
    assert isinstance(make_engine(config), RayEngine)  # a cluster is up (this module's), so auto -> Ray


def test_worker_killed_mid_generate_is_retried(pool, redis_url):
    """A generate whose actor dies mid-request is retried (by Ray on the restarted actor, or by the pool on
    the other one) and answers the same tokens."""
    import ray

    from workers.ray_pool import RayEngine

    engine = RayEngine(EngineConfig(store=pool.config.store, workers="ray"), pool)
    request = GenerateRequest(question="Tell me about the passkey and the river.", chunks=tuple(DOCS[:3]),
                              max_new_tokens=40)
    reference = engine.generate(request)
    killed: list[int] = []

    def kill_the_busy_actor():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            busy = [i for i, n in enumerate(pool._outstanding) if n > 0]
            if busy:
                time.sleep(0.2)  # let it get into the forward passes
                killed.append(busy[0])
                ray.kill(pool.actors[busy[0]], no_restart=False)
            time.sleep(0.01)

    killer = threading.Thread(target=kill_the_busy_actor, daemon=True)
    killer.start()
    result = engine.generate(request)
    killer.join(60)
    assert killed, "no request was in flight to kill"
    assert result.token_ids == reference.token_ids
    assert pool.call_on(killed[0], "ping", timeout=180)["pid"]  # Ray restarted it
