"""`ragkv bench store`: block store throughput vs the same bytes through a plain file / plain redis-py.

Blocks are real KV chunks (see bench/codecs.py) framed once with the default
codec (kivi2). Then, in one run and on the same bytes:

    put_mb_s      BlockStore.put_raw: key checks, LRU/budget bookkeeping, atomic
                  write (disk: temp file + fsync + rename; redis: MULTI with index)
    get_mb_s      (GET_ROUNDS reads per write) BlockStore.get_raw + read_header: fetch, LRU bump, and the block's
                  framing and xxh3-128 checksum verified (everything a hit costs
                  before the codec, whose speed bench codecs reports)
    raw_put_mb_s  open/write/close of a plain file (no fsync) | redis-py SET
    raw_get_mb_s  open/read of that file | redis-py GET
MB = 1e6 bytes of block. The redis figures come from a redis-server started
for the run on a free loopback port. The `redis+cluster-N` rows do the same on
a Redis Cluster of N primaries (no replicas) started on loopback for the run,
the raw figures through a plain redis-py `RedisCluster` GET/SET.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import redis
import redis.cluster
from tqdm import tqdm

from kvstore.backends import open_backend
from kvstore.block import read_header
from kvstore.codecs import make_codec
from kvstore.store import BlockStore
from kvstore.testing import RedisCluster, RedisServer
from ragkv.bench.codecs import FULL_TOKENS, QUICK_TOKENS, real_chunks


GET_ROUNDS = 10  # reads per write: a cache serves many hits per block, and one read is too short to time
CLUSTER_PRIMARIES = (1, 3)


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / max(seconds, 1e-9)


def _time_puts(put, blocks: list[tuple[str, bytes]], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        for addr, data in blocks:
            put(addr, data)
    return _rate(sum(len(b) for _, b in blocks) * reps, time.perf_counter() - t0)


def _time_gets_interleaved(gets: dict, blocks: list[tuple[str, bytes]], rounds: int) -> dict[str, float]:
    """Alternate the readers round by round so machine noise hits both alike (a side-by-side ratio)."""
    seconds = dict.fromkeys(gets, 0.0)
    for _ in range(rounds):
        for name, get in gets.items():
            t0 = time.perf_counter()
            for addr, _ in blocks:
                get(addr)
            seconds[name] += time.perf_counter() - t0
    total = sum(len(b) for _, b in blocks) * rounds
    return {name: _rate(total, s) for name, s in seconds.items()}


def _raw_file(root: Path):
    def put(addr: str, data: bytes) -> None:
        with open(root / addr, "wb") as f:
            f.write(data)

    def get(addr: str) -> bytes:
        with open(root / addr, "rb") as f:
            return f.read()
    return put, get


def _raw_redis(client):
    return (lambda addr, data: client.set("raw:" + addr, data)), (lambda addr: client.get("raw:" + addr))


def _bench_backend(store: BlockStore, raw_put, raw_get, blocks, reps: int) -> dict:
    store.get_raw(blocks[0][0])  # connect first (a cluster client discovers the slot map on first use)
    figures = {"put_mb_s": _time_puts(store.put_raw, blocks, reps), "raw_put_mb_s": _time_puts(raw_put, blocks, reps)}
    gets = _time_gets_interleaved({"get_mb_s": lambda a: read_header(store.get_raw(a)), "raw_get_mb_s": raw_get},
                                  blocks, reps * GET_ROUNDS)
    return {key: figures.get(key, gets.get(key)) for key in ("put_mb_s", "get_mb_s", "raw_put_mb_s", "raw_get_mb_s")}


def run(quick: bool = False, progress: bool = True) -> dict:
    chunks, fingerprint = real_chunks(QUICK_TOKENS if quick else FULL_TOKENS, progress=progress)
    codec = make_codec("kivi2")
    framer = BlockStore(open_backend("memory:"), codec, fingerprint)
    blocks = [(framer.address_for(c.token_ids), framer.encode(c)) for c in chunks]
    reps = 3 if quick else 10
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ragkv-bench-") as tmp, RedisServer(Path(tmp)) as server:
        (Path(tmp) / "raw").mkdir()
        targets = {"disk": f"disk:{Path(tmp) / 'store'}", "redis": server.url}
        for name in tqdm(targets, desc="store backends", disable=not progress):
            store = BlockStore(open_backend(targets[name]), codec, fingerprint)
            if name == "disk":
                raw_put, raw_get = _raw_file(Path(tmp) / "raw")
                out[name] = _bench_backend(store, raw_put, raw_get, blocks, reps)
            else:
                client = redis.Redis.from_url(server.url)
                out[name] = _bench_backend(store, *_raw_redis(client), blocks, reps)
                client.close()
            store.close()
    for n in tqdm(CLUSTER_PRIMARIES, desc="redis clusters", disable=not progress):
        with RedisCluster(primaries=n, replicas=0) as cluster:
            store = BlockStore(open_backend(cluster.url), codec, fingerprint)
            client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
            out[f"redis+cluster-{n}"] = _bench_backend(store, *_raw_redis(client), blocks, reps)
            client.close()
            store.close()
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
