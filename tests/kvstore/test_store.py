"""BlockStore on real KV: damage, foreign blocks and outages are misses, never exceptions."""

from __future__ import annotations

import pytest
import torch

from kvstore.backends import open_backend
from kvstore.block import decode_block
from kvstore.store import BlockStore


@pytest.fixture
def store(backend_url, runner):
    s = BlockStore(open_backend(backend_url), "kivi2", runner.fingerprint)
    yield s
    s.close()


def test_put_get_round_trip(store, real_kv):
    addr = store.address_for(real_kv.token_ids)
    assert store.get(addr) is None
    assert store.put(real_kv, addr)
    kv = store.get(addr, token_ids=real_kv.token_ids)
    assert kv.token_ids == real_kv.token_ids and kv.keys.shape == real_kv.keys.shape
    assert store.get_header(addr).codec == "kivi2"
    assert store.get_many([addr, "0" * 64])[1] is None
    s = store.stats()
    assert s["hits"] >= 2 and s["misses"] >= 2 and not s["degraded"]


def _corrupt(backend_url: str, addr: str, offset: int, tmp_path=None) -> None:
    if backend_url.startswith("disk:"):
        from pathlib import Path

        path = Path(backend_url[5:]) / addr[:2] / (addr + ".blk")
        data = bytearray(path.read_bytes())
        data[offset] ^= 0xFF
        path.write_bytes(bytes(data))
    elif backend_url.startswith("redis"):  # redis:// and redis+cluster://: the value key, index untouched
        backend = open_backend(backend_url)
        r, name = backend.client(), backend.bucket(addr).data(addr)
        data = bytearray(r.get(name))
        data[offset] ^= 0xFF
        r.set(name, bytes(data))
        backend.close()
    else:
        pytest.skip("memory: bytes cannot be damaged in place")


@pytest.mark.parametrize("where", [0, 10, 200, -1000, -1])
def test_flipped_byte_in_stored_block_is_a_miss(store, backend_url, real_kv, where):
    addr = store.address_for(real_kv.token_ids)
    store.put(real_kv, addr)
    size = len(store.get_raw(addr))
    _corrupt(backend_url, addr, where % size)
    assert store.get(addr) is None
    assert store.stats()["corrupt"] == 1
    assert not store.contains(addr)  # the damaged block was dropped


def test_foreign_fingerprint_and_token_mismatch_are_misses(backend_url, real_kv, runner):
    backend = open_backend(backend_url)
    other = BlockStore(backend, "kivi2", "0" * 64)
    addr = other.address_for(real_kv.token_ids)
    other.put(real_kv, addr)
    mine = BlockStore(backend, "kivi2", runner.fingerprint)
    assert mine.get(addr) is None and mine.stats()["foreign"] == 1
    other.put(real_kv, addr)
    assert other.get(addr, token_ids=real_kv.token_ids[:-1] + [0]) is None
    assert other.stats()["token_mismatch"] == 1
    backend.close()


def test_backend_down_is_a_degraded_miss(runner, real_kv):
    from kvstore.testing import free_port

    store = BlockStore(open_backend(f"redis://127.0.0.1:{free_port()}/0"), "int8", runner.fingerprint)
    addr = store.address_for(real_kv.token_ids)
    assert store.get(addr) is None
    assert store.put(real_kv, addr) is False
    s = store.stats()
    assert s["degraded"] and s["unavailable"] >= 2


def test_stored_bytes_are_the_block_format(store, real_kv):
    addr = store.address_for(real_kv.token_ids, namespace="tenant")
    store.put(real_kv, addr)
    kv, header = decode_block(store.get_raw(addr), expected_fingerprint=store.fingerprint)
    assert header.token_ids == real_kv.token_ids
    rel = (kv.values - real_kv.values).norm() / real_kv.values.norm()
    assert rel < 0.46 and torch.isfinite(kv.keys).all()
    assert store.delete(addr) and store.get(addr) is None
