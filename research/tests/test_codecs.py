"""Research's codecs (the other KIVI widths, the rotated hk*) through the product's codec matrix checks.

Bounds: relative L2 error on the default model's 85-token chunk (tests/kvstore/test_codecs.py has the
measured figures of every width; bounds leave ~10-20% headroom)."""

from __future__ import annotations

import pytest
import torch

from kvstore.block import decode_block, encode_block
from kvstore.codecs import CodecError, make_codec

POST, PRE = {"pre_rope": False}, {"pre_rope": True}
CASES = [
    ("k3v2", POST, 0.10, 0.46),
    ("k3v2", PRE, 0.087, 0.46),
    ("k3v3", PRE, 0.087, 0.20),
    ("k4v2", POST, 0.046, 0.46),
    ("k4v2", PRE, 0.040, 0.46),
    ("k4v2", {"group_size": 16, "residual": 16, **PRE}, 0.030, 0.35),
    ("k4v3", PRE, 0.040, 0.20),
    ("k4v4", POST, 0.046, 0.095),
    ("k4v4", PRE, 0.040, 0.095),
    ("hk4v2", {}, 0.05, 0.49),
    ("hk3v4", {}, 0.11, 0.10),
    ("hk4v3", {}, 0.05, 0.21),
    ("hk4v3", POST, 0.06, 0.21),
    ("hk4v4", {}, 0.05, 0.10),
]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("name,params,k_bound,v_bound", CASES, ids=lambda x: str(x))
def test_round_trip_on_real_kv(real_kv, name, params, k_bound, v_bound):
    codec = make_codec(name, **params)
    payload = codec.encode(real_kv.keys, real_kv.values)
    assert len(payload) == codec.payload_size(tuple(real_kv.keys.shape))
    kv, _ = decode_block(encode_block(real_kv, codec, "f" * 64))
    assert kv.pre_rope == codec.pre_rope
    assert rel_err(kv.keys_at(0), real_kv.keys) < k_bound
    assert rel_err(kv.values, real_kv.values) < v_bound


def test_size_ratios_vs_fp16():
    shape = (30, 3, 256, 64)
    fp16 = make_codec("fp16").payload_size(shape)
    # KIVI layout at D = 64, G = 32, scales and zeros counted: keys 8*KB + 8, values 8*VB + 8 of fp16's 256
    for name, nbytes in {"k3v2": 56, "k3v3": 64, "k4v2": 64, "k4v3": 72, "k4v4": 80}.items():
        assert make_codec(name).payload_size(shape) / fp16 == pytest.approx(nbytes / 256)
    # rotated, key groups of 128 tokens (two per 256-token chunk), one value group: keys 8*KB + 2, values 8*VB + 4
    for name, nbytes in {"hk4v2": 54, "hk3v4": 62, "hk4v3": 62, "hk4v4": 70}.items():
        assert make_codec(name).payload_size(shape) / fp16 == pytest.approx(nbytes / 256)


def test_rotated_codec_params_and_checks():
    assert make_codec("hk4v3").params() == {"group_size": 32, "residual": 0, "pre_rope": True, "key_group": 128,
                                            "value_group": 64, "rotate": True}
    assert make_codec("hk4v3") != make_codec("hk4v3", rotate=False)
    with pytest.raises(CodecError, match="head_dim"):
        make_codec("k3v2").payload_size((1, 1, 4, 12))  # 3-bit codes need head_dim % 8 == 0


def test_research_codecs_pickle_by_their_module():
    import pickle

    codec = make_codec("k4v2", pre_rope=True)
    assert pickle.loads(pickle.dumps(codec)) == codec and type(codec).__module__ == "ragkv_research.codecs"
