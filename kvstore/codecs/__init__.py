"""Codec registry: fp16, int8, int4 and the KIVI layout (kivi2, k3v2, k3v3, k4v2, k4v3, k4v4)
and its Hadamard-rotated variants (hk4v2, hk3v4, hk4v3, hk4v4); wk4v3, keys with per-channel widths from a
per-model plan (planned.py, allocation.py).

Math in codecs/quant.py; device dispatch (Triton on CUDA) in kvstore/kernels/dispatch.py."""

from kvstore.codecs.base import CODECS, Codec, CodecError, codec_from_spec, make_codec, register_codec
from kvstore.codecs.fp16 import FP16
from kvstore.codecs.int4 import Int4
from kvstore.codecs.int8 import Int8
from kvstore.codecs.kivi import HK3V4, HK4V2, HK4V3, HK4V4, K3V2, K3V3, K4V2, K4V3, K4V4, KiviCodec, Kivi2
from kvstore.codecs.planned import PlannedKeys

# The serving default (EngineConfig, `ragkv serve`): the fewest bytes per token whose quality-suite
# answers stay within 2 points of fp16 (README "Codecs"). Chosen on `dev` (96 prompts: the codec at or
# under 0.25 of fp16 with the lowest KL to full, KL 0.0025 against hk4v3's 0.0040), reported on `test`
# (96 prompts: +2.1 points against fp16 codec-only and under blend). 0.246 of fp16; int8 (0.53) before.
# Its key plan is the model's (workers/key_plan.py), measured once and stored next to the model.
DEFAULT_CODEC = "wk4v3"

__all__ = ["CODECS", "DEFAULT_CODEC", "Codec", "CodecError", "FP16", "HK3V4", "HK4V2", "HK4V3", "HK4V4", "Int4", "Int8", "K3V2", "K3V3", "K4V2", "K4V3", "K4V4",
           "KiviCodec", "Kivi2", "PlannedKeys", "codec_from_spec", "make_codec", "register_codec"]
