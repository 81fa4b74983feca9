"""RoPE for the compute layer: the math lives in kvstore/rope.py (the kernels use it too); re-exported here."""

from kvstore.rope import RE_ROTATABLE_ROPE_TYPES, apply_rope, layer_freq, rerotate_keys, rope_cos_sin, rotate_half

__all__ = ["RE_ROTATABLE_ROPE_TYPES", "apply_rope", "layer_freq", "rerotate_keys", "rope_cos_sin", "rotate_half"]
