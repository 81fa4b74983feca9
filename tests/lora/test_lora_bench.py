"""`bench lora` in quick mode: the documented JSON shape (docs/benchmarks.md) and stored-byte figures."""

from __future__ import annotations


def test_bench_lora_quick(runner):
    from ragkv.bench import lora

    out = lora.run(quick=True, progress=False)
    assert set(out["adapters"]) == {1, 4, 16}
    for n, figures in out["adapters"].items():
        assert {"full_bytes", "shared_bytes", "agreement"} <= set(figures)
        assert 0.0 <= figures["agreement"] <= 1.0
        assert figures["full_bytes"] > 0 and figures["shared_bytes"] > 0
    a = out["adapters"]
    assert a[16]["full_bytes"] == 16 * a[1]["full_bytes"]  # same chunk, same block size for every adapter
    assert a[16]["shared_bytes"] <= a[16]["full_bytes"] / 4
