"""Codec registry: fp16, int8, int4, the KIVI layout's kivi2, and the default wk4v3 (keys with
per-channel widths from a per-model plan: planned.py, allocation.py). The other KIVI widths and the
Hadamard-rotated codecs are research (research/ragkv_research/codecs.py, a plug-in: kvstore/plugins.py).

Math in codecs/quant.py; device dispatch (Triton on CUDA) in kvstore/kernels/dispatch.py."""

from kvstore.codecs.base import CODECS, Codec, CodecError, codec_from_spec, make_codec, register_codec
from kvstore.codecs.fp16 import FP16, FP32
from kvstore.codecs.int4 import Int4
from kvstore.codecs.int8 import Int8
from kvstore.codecs.kivi import KiviCodec, Kivi2, register_widths
from kvstore.codecs.planned import PlannedKeys

# The serving default (EngineConfig, `ragkv serve`): the fewest bytes per token whose quality-suite
# answers stay within 2 points of fp16 (docs/benchmarks.md "Codecs"). Chosen on `dev` (96 prompts: the codec at or
# under 0.25 of fp16 with the lowest KL to full, KL 0.0025 against hk4v3's 0.0040), reported on `test`
# (96 prompts: +2.1 points against fp16 codec-only and under blend). 0.246 of fp16; int8 (0.53) before.
# Its key plan is the model's (workers/key_plan.py), measured once and stored next to the model.
DEFAULT_CODEC = "wk4v3"

__all__ = ["CODECS", "DEFAULT_CODEC", "Codec", "CodecError", "FP16", "FP32", "Int4", "Int8", "KiviCodec", "Kivi2",
           "PlannedKeys", "codec_from_spec", "make_codec", "register_codec", "register_widths"]
