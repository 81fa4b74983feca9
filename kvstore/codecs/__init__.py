"""Codec registry: fp16, int8, int4, kivi2. Math in codecs/quant.py."""

from kvstore.codecs.base import CODECS, Codec, CodecError, codec_from_spec, make_codec, register_codec
from kvstore.codecs.fp16 import FP16
from kvstore.codecs.int4 import Int4
from kvstore.codecs.int8 import Int8
from kvstore.codecs.kivi2 import Kivi2

__all__ = ["CODECS", "Codec", "CodecError", "FP16", "Int4", "Int8", "Kivi2", "codec_from_spec", "make_codec",
           "register_codec"]
