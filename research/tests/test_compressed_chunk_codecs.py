"""A chunk compressed at ingest through research's rotated pre-RoPE codec (hk4v3): moved from
tests/eviction/test_compressed_chunks.py with the codec (a block names its codec, so it decodes only
where the codec is registered)."""

import torch

from kvstore.block import decode_block, encode_block
from kvstore.codecs import make_codec
from workers.eviction.chunks import compress_chunk
from workers.requests import CompressionSpec

TEXT = ("The grass is green. The sky is blue. The pass key is 71942. Remember it. The sun is yellow. "
        "Here we go. There and back again.")


def _compressed(runner):
    kv = runner.chunk_kv(runner.tokenize(TEXT))
    small, stats = compress_chunk(runner, kv, CompressionSpec(policy="kvzip", budget=0.3))
    return kv, small, stats


def test_pre_rope_compressed_chunk_places_keys_like_post_rope(runner):
    """A compressed chunk through a pre-RoPE codec: each kept key is un-rotated by its own position and rotated
    at start + that position when fused, the same keys as the post-RoPE block within quantization error."""
    kv, small, _ = _compressed(runner)
    placed = {}
    for pre in (True, False):
        back, _ = decode_block(encode_block(small, make_codec("hk4v3", pre_rope=pre), "fp"))
        assert back.pre_rope == pre and torch.equal(back.positions, small.positions)
        placed[pre] = back.keys_at(37, runner.inv_freq)
    exact = small.keys_at(37, runner.inv_freq)
    mask = small.head_mask[..., None].expand_as(exact)
    err = {pre: ((placed[pre] - exact)[mask].norm() / exact[mask].norm()).item() for pre in placed}
    assert err[True] < 0.06 and err[False] < 0.07  # measured 0.043 / 0.053 on a whole chunk (test_codecs.py)
    unrotated = small.with_rope(True)  # the pre-RoPE transform alone is exact: each key by its own position
    truly = kv.with_rope(True).keys.gather(2, small.positions[..., None].expand_as(small.keys))  # [L, H, S, D]
    assert unrotated.pre_rope and ((unrotated.keys - truly)[mask].norm() / truly[mask].norm()).item() < 1e-5
    lossless = unrotated.keys_at(37)
    assert ((lossless - exact)[mask].norm() / exact[mask].norm()).item() < 1e-5
