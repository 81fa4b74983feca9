"""Multi-LoRA KV sharing (research; run by `ragkv bench lora`): one base chunk cache shared by every
adapter plus low-rank per-adapter parts."""

from workers.lora.adapter import AdapterModels, LoraAdapter, random_adapter
from workers.lora.lowrank import adapter_chunk, reconstruct, relative_error_per_layer
from workers.lora.storage import LoraKVStore

__all__ = ["AdapterModels", "LoraAdapter", "LoraKVStore", "adapter_chunk", "random_adapter", "reconstruct",
           "relative_error_per_layer"]
