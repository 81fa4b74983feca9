"""Multi-LoRA KV sharing: one base chunk cache shared by every adapter plus low-rank per-adapter parts."""

from workers.lora.adapter import AdapterModels, LoraAdapter, random_adapter
from workers.lora.layouts import LoraKVStore
from workers.lora.lowrank import adapter_chunk, reconstruct, relative_error_per_layer

__all__ = ["AdapterModels", "LoraAdapter", "LoraKVStore", "adapter_chunk", "random_adapter", "reconstruct",
           "relative_error_per_layer"]
