"""KIVI-layout widths and Hadamard-rotated codecs no default uses (the product keeps fp16, int8, int4,
kivi2 and wk4v3). Same implementation (kvstore/codecs/kivi.py `KiviCodec`), only the registrations.

Bytes per (layer, head, token) at D = 64, G = 32: k3v2 56 (0.219)  k3v3 64 (0.25)  k4v2 64 (0.25)
k4v3 72 (0.281)  k4v4 80 (0.3125); rotated (pre-RoPE keys, key groups of 128 tokens, one value group
of 64 channels): hk4v2 54 (0.211)  hk3v4 62 (0.242)  hk4v3 62 (0.242)  hk4v4 70 (0.273).
The study: research/codecs.md; figures in docs/benchmarks.md "Codecs".
"""

from __future__ import annotations

from kvstore.codecs import KiviCodec, register_widths


def _rotated(name: str, key_bits: int, value_bits: int, doc: str) -> type[KiviCodec]:
    """A Hadamard-rotated codec with pre-RoPE keys: key groups of 128 tokens, one value group of 64 channels."""
    return register_widths(name, key_bits, value_bits, True, doc, __name__, key_group=128, value_group=64, rotate=True)


K3V2 = register_widths("k3v2", 3, 2, False, "Keys 3-bit per channel, values 2-bit per token.", __name__)
K3V3 = register_widths("k3v3", 3, 3, False, "Keys and values 3-bit.", __name__)
K4V2 = register_widths("k4v2", 4, 2, False, "Keys 4-bit per channel, values 2-bit per token (0.25 of fp16 at D = 64).", __name__)
K4V3 = register_widths("k4v3", 4, 3, False, "Keys 4-bit, values 3-bit.", __name__)
K4V4 = register_widths("k4v4", 4, 4, False, "Keys and values 4-bit, in the KIVI layout.", __name__)
HK3V4 = _rotated("hk3v4", 3, 4, "Rotated; keys 3-bit over 128-token groups, values 4-bit (0.24 of fp16 at D = 64).")
HK4V2 = _rotated("hk4v2", 4, 2, "Rotated; keys 4-bit over 128-token groups, values 2-bit (0.21 of fp16 at D = 64).")
HK4V3 = _rotated("hk4v3", 4, 3, "Rotated; keys 4-bit over 128-token groups, values 3-bit (0.24 of fp16 at D = 64).")
HK4V4 = _rotated("hk4v4", 4, 4, "Rotated; keys and values 4-bit (0.27 of fp16 at D = 64).")
