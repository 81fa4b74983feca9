"""The decoded-KV tier (kvstore/decoded.py) in front of a BlockStore: it changes what a read costs, never
what it returns. Bit-for-bit the KV decoding gives, LRU within its byte budget, and every damaged,
foreign, deleted or replaced block still a miss."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvstore.backends import open_backend
from kvstore.block import decode_block
from kvstore.decoded import DecodedTier, kv_bytes
from kvstore.kv import ChunkKV
from kvstore.store import BlockStore

CODEC = "wk4v3"  # the default codec's layout (pre-RoPE keys, rotated values); no plan: 4 bits a key channel


def _chunk(real_kv: ChunkKV, i: int) -> ChunkKV:
    """A distinct chunk per i: its own tokens (address) and its own values."""
    return dataclasses.replace(real_kv, token_ids=[t + i for t in real_kv.token_ids], values=real_kv.values + i)


def _store(url: str, fingerprint: str, budget: int) -> BlockStore:
    return BlockStore(open_backend(url), CODEC, fingerprint, decoded_budget_bytes=budget)


def _same(a: ChunkKV, b: ChunkKV) -> bool:
    return (torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and a.token_ids == b.token_ids
            and a.pre_rope == b.pre_rope and torch.equal(a.inv_freq, b.inv_freq) and a.keys.dtype == b.keys.dtype)


def test_a_hit_is_bit_for_bit_what_decoding_returns(backend_url, real_kv, runner):
    store = _store(backend_url, runner.fingerprint, 64 << 20)
    addr = store.address_for(real_kv.token_ids)
    store.put(real_kv, addr)
    decoded, _ = decode_block(store.get_raw(addr), expected_fingerprint=runner.fingerprint)
    first = store.get(addr, real_kv.token_ids)  # decoded, kept
    again = store.get(addr, real_kv.token_ids)  # from the tier
    assert again is first and _same(again, decoded)
    [many] = store.get_many([addr], [real_kv.token_ids])
    assert many is first
    s = store.stats()
    assert s["decoded"] == {"bytes_used": kv_bytes(decoded), "budget_bytes": 64 << 20, "blocks": 1, "evictions": 0,
                            "hits": 2, "misses": 1}
    assert s["hits"] == 3  # the store's own counts do not change: a tier hit is a store hit
    store.close()


def test_get_many_decodes_the_cold_blocks_and_matches_get(real_kv, runner):
    store = _store("memory:", runner.fingerprint, 64 << 20)
    chunks = [_chunk(real_kv, i) for i in range(3)]
    addrs = [store.address_for(c.token_ids) for c in chunks]
    for c, a in zip(chunks, addrs):
        store.put(c, a)
    warm = store.get(addrs[1])
    out = store.get_many(addrs + ["0" * 64], [c.token_ids for c in chunks] + [None])
    assert out[1] is warm and out[3] is None
    for kv, a in zip(out, addrs):
        assert _same(kv, decode_block(store.get_raw(a), expected_fingerprint=runner.fingerprint)[0])
    assert store.get_many(addrs[:1], [chunks[0].token_ids[:-1] + [0]]) == [None]  # a token mismatch is a miss
    assert store.stats()["token_mismatch"] == 1
    with pytest.raises(ValueError, match="token id lists"):
        store.get_many(addrs, [None])


def test_the_byte_budget_is_kept_least_recently_used_first(real_kv, runner):
    size = kv_bytes(decode_block(BlockStore(None, CODEC, runner.fingerprint).encode(real_kv))[0])
    store = _store("memory:", runner.fingerprint, 2 * size + size // 2)  # room for two chunks
    chunks = [_chunk(real_kv, i) for i in range(3)]
    addrs = [store.address_for(c.token_ids) for c in chunks]
    for c, a in zip(chunks, addrs):
        store.put(c, a)
    store.get(addrs[0]), store.get(addrs[1]), store.get(addrs[0])  # 1 is now the least recently used
    store.get(addrs[2])  # evicts 1
    tier = store.stats().decoded
    assert tier.blocks == 2 and tier.bytes_used == 2 * size <= tier.budget_bytes and tier.evictions == 1
    assert addrs[1] not in store.decoded and addrs[0] in store.decoded and addrs[2] in store.decoded
    assert store.get(addrs[1]) is not None  # decoded again from its block
    assert store.stats().decoded.misses == 4


def test_a_chunk_over_the_budget_is_not_kept_and_budget_zero_is_off(real_kv, runner):
    for budget in (0, 1024):
        store = _store("memory:", runner.fingerprint, budget)
        addr = store.address_for(real_kv.token_ids)
        store.put(real_kv, addr)
        assert store.get(addr) is not store.get(addr)  # decoded each time
        assert store.stats().decoded.blocks == 0
    assert store.stats().decoded.misses == 2 and store.stats().decoded.hits == 0
    with pytest.raises(ValueError):
        DecodedTier(-1)


def _flip(store: BlockStore, addr: str, offset: int) -> None:
    """Damage the stored bytes behind the store's back (in the backend itself)."""
    data = bytearray(store.get_raw(addr))
    data[offset % len(data)] ^= 0xFF
    store.backend.put(addr, bytes(data))


@pytest.mark.parametrize("where", [0, 10, 200, -1000, -1])
def test_a_block_damaged_after_it_was_decoded_is_a_miss_never_kv(real_kv, runner, where):
    store = _store("memory:", runner.fingerprint, 64 << 20)
    addr = store.address_for(real_kv.token_ids)
    store.put(real_kv, addr)
    assert store.get(addr) is not None and addr in store.decoded
    _flip(store, addr, where)
    assert store.get(addr) is None
    assert store.stats()["corrupt"] == 1 and addr not in store.decoded and not store.contains(addr)
    store.put(real_kv, addr)  # rewritten whole: decoded again
    assert store.get_many([addr]) != [None] and store.stats()["corrupt"] == 1


def test_a_foreign_block_under_a_known_address_is_a_miss(real_kv, runner):
    backend = open_backend("memory:")
    mine = BlockStore(backend, CODEC, runner.fingerprint, decoded_budget_bytes=64 << 20)
    other = BlockStore(backend, CODEC, "0" * 64)
    addr = mine.address_for(real_kv.token_ids)
    mine.put(real_kv, addr)
    assert mine.get(addr) is not None
    other.put(real_kv, addr)  # another model's block where this one's was (a shared store, a forged write)
    assert mine.get(addr) is None and mine.stats()["foreign"] == 1 and addr not in mine.decoded
    assert mine.get_many([addr]) == [None]


def test_delete_replace_and_backend_eviction_invalidate(real_kv, runner, backend_url):
    store = _store(backend_url, runner.fingerprint, 64 << 20)
    addr = store.address_for(real_kv.token_ids)
    store.put(real_kv, addr)
    assert store.get(addr) is not None
    assert store.delete(addr) and addr not in store.decoded and store.get(addr) is None
    store.put(real_kv, addr)
    kept = store.get(addr)
    store.backend.delete(addr)  # dropped behind the store's back (a budget, another replica's Evict)
    assert store.get(addr) is None and store.get_many([addr]) == [None] and addr not in store.decoded
    store.put(real_kv, addr)
    assert addr not in store.decoded  # a write through the store forgets the old entry
    assert store.get(addr) is not kept
    store.close()
