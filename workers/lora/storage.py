"""Where LoRA chunk KV lives in a BlockStore: the `full` and `shared` storage schemes and their addresses.

- full:   the adapter model's complete chunk KV, a normal block under namespace `lora/<id>/full`.
- shared: the base model's chunk block (namespace "", the very block plain serving stores, one for
          all adapters) plus a small per-adapter block of low-rank parts under
          `lora/<id>/lowrank-kv-r<rank>`, framed and checksummed like any block.

The adapter id is in the namespace and the codec in the address, so every adapter and every
scheme has its own address. Use one codec for both schemes (fp16 here: the low-rank parts are
not KV-shaped enough for kivi2's per-channel groups to be meaningful).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvstore.kv import ChunkKV
from kvstore.store import BlockStore
from workers.lora.adapter import LoraAdapter
from workers.lora.lowrank import reconstruct
from workers.runner import ModelRunner

BASE_NAMESPACE = ""  # the shared base block is the ordinary chunk block


def full_namespace(adapter: LoraAdapter) -> str:
    return f"lora/{adapter.adapter_id}/full"


def parts_namespace(adapter: LoraAdapter) -> str:
    return f"lora/{adapter.adapter_id}/lowrank-kv-r{adapter.rank}"


@dataclass
class LoraKVStore:
    """A BlockStore seen through the two storage schemes. `runner` is the base model's runner (RoPE frequencies)."""

    store: BlockStore
    runner: ModelRunner

    def base_address(self, token_ids: Sequence[int]) -> str:
        return self.store.address_for(token_ids, BASE_NAMESPACE)

    def full_address(self, adapter: LoraAdapter, token_ids: Sequence[int]) -> str:
        return self.store.address_for(token_ids, full_namespace(adapter))

    def parts_address(self, adapter: LoraAdapter, token_ids: Sequence[int]) -> str:
        return self.store.address_for(token_ids, parts_namespace(adapter))

    # -- writes ---------------------------------------------------------------
    def put_full(self, adapter: LoraAdapter, full: ChunkKV) -> list[str]:
        address = self.full_address(adapter, full.token_ids)
        self.store.put(full, address)
        return [address]

    def put_shared(self, adapter: LoraAdapter, base: ChunkKV, parts: ChunkKV) -> list[str]:
        """Stores the base block once (skipped when present) and this adapter's parts block."""
        base_address = self.base_address(base.token_ids)
        if not self.store.contains(base_address):
            self.store.put(base, base_address)
        parts_address = self.parts_address(adapter, parts.token_ids)
        self.store.put(parts, parts_address)
        return [base_address, parts_address]

    # -- reads ----------------------------------------------------------------
    def get_full(self, adapter: LoraAdapter, token_ids: Sequence[int]) -> ChunkKV | None:
        return self.store.get(self.full_address(adapter, token_ids), token_ids)

    def get_shared(self, adapter: LoraAdapter, token_ids: Sequence[int]) -> ChunkKV | None:
        """The reconstructed chunk KV, or None if either block is missing or damaged."""
        base = self.store.get(self.base_address(token_ids), token_ids)
        parts = self.store.get(self.parts_address(adapter, token_ids), token_ids) if base is not None else None
        if base is None or parts is None:
            return None
        return reconstruct(self.runner, base, parts, adapter)

    def stored_bytes(self, addresses: Sequence[str]) -> int:
        """Bytes the backend actually holds for these addresses (each counted once)."""
        total = 0
        for address in dict.fromkeys(addresses):
            data = self.store.get_raw(address)
            total += len(data) if data is not None else 0
        return total
