"""Addresses per adapter and storage scheme, bytes from the store, and damaged parts read as a miss."""

from __future__ import annotations

import torch

from kvstore.backends.memory import MemoryBackend
from kvstore.store import BlockStore
from workers.lora import LoraKVStore, adapter_chunk, random_adapter, relative_error_per_layer


def _store(runner) -> LoraKVStore:
    return LoraKVStore(BlockStore(MemoryBackend(), "fp16", runner.fingerprint), runner)


def test_adapter_id_is_a_digest_of_the_weights(runner, adapters):
    adapter, zero = adapters
    assert adapter.adapter_id == random_adapter(runner, rank=4, seed=7).adapter_id
    assert len({adapter.adapter_id, zero.adapter_id, random_adapter(runner, rank=4, seed=8).adapter_id}) == 3


def test_addresses_differ_per_adapter_and_layout(runner, adapters, chunk_ids):
    adapter, zero = adapters
    store = _store(runner)
    addresses = [store.base_address(chunk_ids),
                 store.full_address(adapter, chunk_ids), store.parts_address(adapter, chunk_ids),
                 store.full_address(zero, chunk_ids), store.parts_address(zero, chunk_ids)]
    assert len(set(addresses)) == len(addresses)
    assert store.base_address(chunk_ids) == store.store.address_for(chunk_ids)  # the ordinary chunk block


def test_stored_bytes_and_round_trip(runner, models, adapters, chunk_ids):
    store = _store(runner)
    base = runner.chunk_kv(chunk_ids)
    shared_addresses, full_addresses = [], []
    for adapter in adapters:
        full, parts = adapter_chunk(models.runner_for(adapter), adapter, chunk_ids)
        full_addresses += store.put_full(adapter, full)
        shared_addresses += store.put_shared(adapter, base, parts)
        rebuilt = store.get_shared(adapter, chunk_ids)
        k_err, v_err = relative_error_per_layer(rebuilt, full)
        assert k_err[0] < 2e-3 and v_err[0] < 2e-3  # exact up to fp16 storage
        torch.testing.assert_close(store.get_full(adapter, chunk_ids).keys, full.keys.half().float())
    backend = store.store.backend
    raw = {a: len(backend.get(a)) for a in set(full_addresses + shared_addresses)}
    assert store.stored_bytes(full_addresses) == sum(raw[a] for a in set(full_addresses))
    assert store.stored_bytes(shared_addresses) == sum(raw[a] for a in set(shared_addresses))
    assert store.store.counters.puts == 5  # base block once for both adapters
    assert store.store.counters.bytes_written == sum(raw.values())
    # per-adapter parts are a small fraction of a full block (rank 4 of 192 k/v dims, plus framing)
    parts_bytes = raw[store.parts_address(adapters[0], chunk_ids)]
    assert parts_bytes < raw[store.full_address(adapters[0], chunk_ids)] / 8


def test_damaged_parts_block_is_a_miss(runner, models, adapters, chunk_ids):
    adapter, _ = adapters
    store = _store(runner)
    _, parts = adapter_chunk(models.runner_for(adapter), adapter, chunk_ids)
    store.put_shared(adapter, runner.chunk_kv(chunk_ids), parts)
    address = store.parts_address(adapter, chunk_ids)
    data = bytearray(store.store.backend.get(address))
    data[-40] ^= 0xFF
    store.store.backend.put(address, bytes(data))
    assert store.get_shared(adapter, chunk_ids) is None
    assert store.store.counters.corrupt == 1 and not store.store.contains(address)
