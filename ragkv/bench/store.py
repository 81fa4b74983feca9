"""`ragkv bench store`: block store throughput vs the same bytes through a plain file / plain redis-py.

Blocks are real KV chunks (see bench/codecs.py) framed once with the default
codec (kivi2). Then, in one run and on the same bytes:

    put_mb_s      BlockStore.put_raw: key checks, LRU/budget bookkeeping, atomic
                  write (disk: temp file + fsync + rename; redis: MULTI with index)
    get_mb_s      BlockStore.get_raw + read_header: fetch, LRU bump, and the block's
                  framing and sha256 checksum verified (everything a hit costs
                  before the codec, whose speed bench codecs reports)
    raw_put_mb_s  open/write/close of a plain file (no fsync) | redis-py SET
    raw_get_mb_s  open/read of that file | redis-py GET
MB = 1e6 bytes of block. The redis figures come from a redis-server started
for the run on a free loopback port.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from kvstore.backends import open_backend
from kvstore.block import read_header
from kvstore.codecs import make_codec
from kvstore.store import BlockStore
from kvstore.testing import RedisServer
from ragkv.bench.codecs import FULL_TOKENS, QUICK_TOKENS, real_chunks


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / max(seconds, 1e-9)


def _bench_store(store: BlockStore, blocks: list[tuple[str, bytes]], reps: int) -> tuple[float, float]:
    total = sum(len(b) for _, b in blocks)
    t_put = t_get = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        for addr, data in blocks:
            store.put_raw(addr, data)
        t_put += time.perf_counter() - t0
        t0 = time.perf_counter()
        for addr, _ in blocks:
            read_header(store.get_raw(addr))
        t_get += time.perf_counter() - t0
    return _rate(total * reps, t_put), _rate(total * reps, t_get)


def _bench_raw_files(root: Path, blocks: list[tuple[str, bytes]], reps: int) -> tuple[float, float]:
    total = sum(len(b) for _, b in blocks)
    t_put = t_get = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        for addr, data in blocks:
            with open(root / addr, "wb") as f:
                f.write(data)
        t_put += time.perf_counter() - t0
        t0 = time.perf_counter()
        for addr, _ in blocks:
            with open(root / addr, "rb") as f:
                f.read()
        t_get += time.perf_counter() - t0
    return _rate(total * reps, t_put), _rate(total * reps, t_get)


def _bench_raw_redis(url: str, blocks: list[tuple[str, bytes]], reps: int) -> tuple[float, float]:
    import redis

    r = redis.Redis.from_url(url)
    total = sum(len(b) for _, b in blocks)
    t_put = t_get = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        for addr, data in blocks:
            r.set("raw:" + addr, data)
        t_put += time.perf_counter() - t0
        t0 = time.perf_counter()
        for addr, _ in blocks:
            r.get("raw:" + addr)
        t_get += time.perf_counter() - t0
    r.close()
    return _rate(total * reps, t_put), _rate(total * reps, t_get)


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
                raw_put, raw_get = _bench_raw_files(Path(tmp) / "raw", blocks, reps)
            else:
                raw_put, raw_get = _bench_raw_redis(server.url, blocks, reps)
            put, get = _bench_store(store, blocks, reps)
            store.close()
            out[name] = {"put_mb_s": put, "get_mb_s": get, "raw_put_mb_s": raw_put, "raw_get_mb_s": raw_get}
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
