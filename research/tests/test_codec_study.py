"""The codec study's quantizers (plain torch) and a quick end-to-end run on the real model."""

import torch

from kvstore.codecs import quant
from ragkv_research import codec_study


def test_lloyd_max_2bit_uses_four_levels_per_group_and_keeps_the_outlier_exact():
    torch.manual_seed(0)
    x = torch.randn(3, 70)  # 70 = two full groups of 32 and a tail of 6
    x[1, 5] = 40.0
    out = codec_study.lloyd_max_2bit(x, group_size=32, exact_per_group=1)
    assert out.shape == x.shape and out[1, 5] == 40.0
    for row in range(3):
        for start in (0, 32, 64):
            group, fitted = x[row, start:start + 32], out[row, start:start + 32]
            levels = set(fitted[fitted != group].tolist())
            assert len(levels) <= 4
    minmax = quant.dequantize_asym(*quant.quantize_asym(x, 2, 32), 32)  # kivi2's min-max 2-bit groups
    assert codec_study.relative_error(out, x) < codec_study.relative_error(minmax, x)


def test_ideal2_keys_quantizes_before_rope(runner):
    """Keys whose un-rotated channels take 4 evenly spaced values come back exactly; the same keys would
    not survive 2-bit quantization after RoPE, which smears every channel over many values."""
    from workers.rope import rerotate_keys

    torch.manual_seed(0)
    levels = torch.tensor([-1.5, -0.5, 0.5, 1.5])
    unrotated = levels[torch.randint(0, 4, (1, 1, 24, runner.shape.head_dim))] * (1 + torch.rand(runner.shape.head_dim))
    keys = rerotate_keys(unrotated, torch.arange(24), runner.inv_freq)
    assert codec_study.relative_error(codec_study.ideal2_keys(keys, runner.inv_freq), keys) < 1e-5
    assert codec_study.relative_error(codec_study.lloyd_max_2bit(keys.transpose(-1, -2)).transpose(-1, -2), keys) > 0.01


def test_quick_study_reports_every_variant():
    out = codec_study.run(quick=True, progress=False)
    assert set(out["codec_only_accuracy"]) == {"full", "fp16", "int4", "kivi2", "kivi2-keys", "kivi2-values",
                                               "ideal2-keys"}
    assert out["relative_error"]["fp16"]["keys"] < 1e-3
    assert out["relative_error"]["kivi2-keys"]["values"] == 0.0 and out["relative_error"]["kivi2-values"]["keys"] == 0.0
