"""Codec registry: fp16, int8, int4 and the KIVI layout (kivi2, k3v2, k3v3, k4v2, k4v3, k4v4)
and its Hadamard-rotated variants (hk4v2, hk3v4, hk4v3, hk4v4).

Math in codecs/quant.py; device dispatch (Triton on CUDA) in kvstore/kernels/dispatch.py."""

from kvstore.codecs.base import CODECS, Codec, CodecError, codec_from_spec, make_codec, register_codec
from kvstore.codecs.fp16 import FP16
from kvstore.codecs.int4 import Int4
from kvstore.codecs.int8 import Int8
from kvstore.codecs.kivi import HK3V4, HK4V2, HK4V3, HK4V4, K3V2, K3V3, K4V2, K4V3, K4V4, KiviCodec, Kivi2

# The serving default (EngineConfig, `ragkv serve`): the fewest bytes per token whose quality-suite
# answers stay within 2 points of fp16 (README "Codecs"). Chosen on the dev split's full run (48
# prompts): int8 0.77 = fp16 0.77; k4v3 0.73 and every smaller codec lost more.
DEFAULT_CODEC = "int8"

__all__ = ["CODECS", "DEFAULT_CODEC", "Codec", "CodecError", "FP16", "HK3V4", "HK4V2", "HK4V3", "HK4V4", "Int4", "Int8", "K3V2", "K3V3", "K4V2", "K4V3", "K4V4",
           "KiviCodec", "Kivi2", "codec_from_spec", "make_codec", "register_codec"]
