"""`python -m ragkv.bench.gpu --json OUT`: the GPU check, one JSON (deploy/gpu_check.sh runs it).

1. the kernel tests on the GPU (pytest -m kernels, RAGKV_KERNEL_DEVICE=cuda);
2. kernel bandwidth: Triton dequantize(+RoPE rotation) vs the torch reference, both on
   the GPU, against the device's copy bandwidth (clone of a large tensor) measured in the same run,
   for the default codec (kvstore.codecs.DEFAULT_CODEC: pre-RoPE keys rotated per token at their
   target positions), kivi2, int8 and int4;
3. block encode on the device: quantize on the GPU, packed parts to the host through one pinned
   buffer (kvstore/kernels/transfer.py), and decode back onto the device (payload copied once);
4. blend TTFT vs full prefill: Engine on the GPU, temp disk store, default codec, 8 and 16 chunks
   x 256 tokens.

Fails fast, before any work, when torch sees no CUDA device or triton is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def require_cuda():
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(f"ragkv.bench.gpu: no CUDA device (torch {torch.__version__}, built for CUDA "
                         f"{torch.version.cuda}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                         "this check needs an NVIDIA GPU")
    try:
        import triton
    except ImportError:
        raise SystemExit("ragkv.bench.gpu: triton is not installed; the GPU kernels need it") from None
    return torch, triton


def _time_ms(torch, fn, iters: int, device: str = "cuda") -> float:
    """Median wall time of fn() in ms, after 2 warm-up calls (CUDA events on the GPU; perf_counter on CPU,
    where the tests smoke-run these functions under TRITON_INTERPRET=1)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        if device != "cuda":
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(torch, nbytes: int, iters: int, device: str = "cuda") -> float:
    """GB/s of torch.clone (read + write) on this device."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    ms = _time_ms(torch, lambda: x.clone(), iters, device)
    return 2 * nbytes / ms / 1e6


def kernel_bandwidth(torch, shape: tuple[int, int, int, int], iters: int, copy_gbs: float,
                     device: str = "cuda") -> dict:
    """Triton vs torch reference for each hot-path op on fp16 KV of `shape` [L, H, T, D]."""
    from kvstore.kernels import dispatch as K

    from kvstore.codecs import DEFAULT_CODEC, make_codec

    L, H, T, D = shape
    x = torch.randn(shape, device=device, dtype=torch.float16)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    delta = 2048
    positions = delta + torch.arange(T, device=device)  # pre-RoPE keys: one rotation to their target positions
    kivi_k = K.quantize_channel(x, 2, 32, backend="triton")
    kivi_v = K.quantize_token(x, 2, 32, backend="triton")
    int8 = K.quantize_token(x, 8, D, backend="triton")
    int4 = K.quantize_token(x, 4, 32, backend="triton")
    default = make_codec(DEFAULT_CODEC)
    kb, vb, g = getattr(default, "key_bits", 4), getattr(default, "value_bits", 2), getattr(default, "group_size", 32)
    dk = K.quantize_channel(x, kb, g, backend="triton")
    dv = K.quantize_token(x, vb, g, backend="triton")
    ops = {
        f"{DEFAULT_CODEC}_keys_dequant_rotate": (dk, lambda b: K.dequantize_channel(
            *dk, kb, g, delta=positions, inv_freq=inv_freq, out_dtype=torch.float16, backend=b)),
        f"{DEFAULT_CODEC}_values_dequant": (dv, lambda b: K.dequantize_token(
            *dv, vb, g, out_dtype=torch.float16, backend=b)),
        f"{DEFAULT_CODEC}_keys_quantize": ((x,), lambda b: K.quantize_channel(x, kb, g, backend=b)),
        "kivi2_keys_dequant_rerotate": (kivi_k, lambda b: K.dequantize_channel(
            *kivi_k, 2, 32, delta=delta, inv_freq=inv_freq, out_dtype=torch.float16, backend=b)),
        "kivi2_values_dequant": (kivi_v, lambda b: K.dequantize_token(
            *kivi_v, 2, 32, out_dtype=torch.float16, backend=b)),
        "int8_keys_dequant_rerotate": (int8, lambda b: K.dequantize_token(
            *int8, 8, D, delta=delta, inv_freq=inv_freq, out_dtype=torch.float16, backend=b)),
        "int4_dequant": (int4, lambda b: K.dequantize_token(*int4, 4, 32, out_dtype=torch.float16, backend=b)),
        "rerotate_fp16": ((x,), lambda b: K.rerotate_keys(x, delta, inv_freq, backend=b)),
        "kivi2_keys_quantize": ((x,), lambda b: K.quantize_channel(x, 2, 32, backend=b)),
    }
    out = {}
    for name, (inputs, fn) in ops.items():
        result = fn("triton")
        result = result if isinstance(result, tuple) else (result,)
        nbytes = sum(t.numel() * t.element_size() for t in (*inputs, *result) if t is not None)
        row = {"bytes_moved": nbytes}
        for backend in ("triton", "torch"):
            ms = _time_ms(torch, lambda: fn(backend), iters, device)
            row[backend] = {"ms": round(ms, 4), "gb_s": round(nbytes / ms / 1e6, 1)}
        row["speedup_vs_torch"] = round(row["torch"]["ms"] / row["triton"]["ms"], 2)
        row["fraction_of_copy_bw"] = round(row["triton"]["gb_s"] / copy_gbs, 3)
        out[name] = row
    return out


def block_round_trip(torch, shape: tuple[int, int, int, int], iters: int, device: str = "cuda") -> dict:
    """Default codec on fp16 KV resident on the GPU: encode (quantize there, pinned host copy of the packed
    parts) and decode (payload to the device once, dequantize there), MB/s of fp16-equivalent KV."""
    from kvstore.codecs import DEFAULT_CODEC, make_codec
    from kvstore.codecs.base import to_bytes
    from kvstore.kernels.transfer import pinned_ok, to_host

    codec = make_codec(DEFAULT_CODEC)
    keys = torch.randn(shape, device=device, dtype=torch.float16)
    values = torch.randn(shape, device=device, dtype=torch.float16)
    fp16_mb = 2 * keys.numel() * 2 / 1e6
    payload = to_bytes(*to_host(codec.encode_parts(keys, values)))
    assert payload == codec.encode(keys.cpu(), values.cpu()), "GPU encode differs from the CPU reference"
    enc_ms = _time_ms(torch, lambda: to_bytes(*to_host(codec.encode_parts(keys, values))), iters, device)
    dec_ms = _time_ms(torch, lambda: codec.decode(payload, shape, torch.float16, device=device), iters, device)
    return {"codec": DEFAULT_CODEC, "shape": list(shape), "pinned": pinned_ok(), "payload_bytes": len(payload),
            "encode_mb_s": round(fp16_mb / enc_ms * 1e3, 1), "decode_mb_s": round(fp16_mb / dec_ms * 1e3, 1),
            "bytes_equal_cpu": True}


def kernel_tests(timeout_s: int) -> dict:
    """The tests/kernels suite on the GPU."""
    if not (REPO / "tests" / "kernels").is_dir():
        return {"ran": False, "reason": f"no tests/kernels under {REPO}"}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["RAGKV_KERNEL_DEVICE"] = "cuda"
    env.pop("RAGKV_FORCE_TORCH", None)
    cmd = [sys.executable, "-m", "pytest", "tests/kernels", "-m", "kernels", "-q", "-p", "no:cacheprovider"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return {"ran": True, "passed": proc.returncode == 0, "returncode": proc.returncode,
            "summary": lines[-1] if lines else "", "tail": lines[-30:] if proc.returncode else [],
            "seconds": round(time.perf_counter() - start, 1)}


def blend_ttft(model: str, num_queries: int, num_chunks: int = 8, chunk_tokens: int = 256) -> dict:
    """Median TTFT of full prefill vs blend on the GPU (default codec, chunks ingested first)."""
    from kvstore.codecs import DEFAULT_CODEC
    from ragkv.bench.rag_dataset import make_queries
    from workers.engine import Engine, EngineConfig
    from workers.requests import GenerateRequest

    modes = ("full", "blend")
    with tempfile.TemporaryDirectory(prefix="ragkv-gpu-blend-") as tmp:
        engine = Engine(EngineConfig(model=model, store=f"disk:{tmp}", codec=DEFAULT_CODEC, device="cuda"))
        try:
            count = lambda text: len(engine.runner.tokenize(text))  # noqa: E731
            warm = make_queries(1, 2, 32, count, seed=999)[0]
            for mode in modes:  # allocator, kernel compilation
                engine.generate(GenerateRequest(question=warm.question, chunks=warm.chunks, mode=mode,
                                                max_new_tokens=2))
            ttft = {mode: [] for mode in modes}
            prompt_tokens = []
            for query in make_queries(num_queries, num_chunks, chunk_tokens, count, seed=num_chunks):
                engine.ingest(query.chunks)
                for mode in modes:
                    result = engine.generate(GenerateRequest(question=query.question, chunks=query.chunks,
                                                             mode=mode, max_new_tokens=4))
                    ttft[mode].append(result.ttft_s)
                prompt_tokens.append(len(result.prompt_token_ids))
            device = str(engine.runner.device)
        finally:
            engine.close()
    median = {mode: statistics.median(v) for mode, v in ttft.items()}
    return {"device": device, "codec": DEFAULT_CODEC, "chunks": num_chunks, "chunk_tokens": chunk_tokens,
            "prompt_tokens": round(statistics.mean(prompt_tokens)), "queries": num_queries,
            "ttft_s": median, "speedup_blend_vs_full": median["full"] / median["blend"]}


def run(quick: bool = False, model: str = "default", tests: bool = True) -> dict:
    torch, triton = require_cuda()
    started = time.perf_counter()
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "triton": triton.__version__, "quick": quick}
    report["kernel_tests"] = kernel_tests(timeout_s=240) if tests else {"ran": False, "reason": "--no-tests"}
    iters = 5 if quick else 20
    copy_gbs = copy_bandwidth(torch, (64 if quick else 1024) << 20, iters)
    report["copy_bandwidth_gb_s"] = round(copy_gbs, 1)
    shape = (4, 8, 1024, 128) if quick else (24, 8, 4096, 128)
    report["kernel_bandwidth"] = {"shape": list(shape), "dtype": "float16",
                                  "ops": kernel_bandwidth(torch, shape, iters, copy_gbs)}
    report["block_round_trip"] = block_round_trip(torch, (30, 3, 1024, 64) if quick else (30, 3, 4096, 64), iters)
    torch.cuda.empty_cache()
    queries = 2 if quick else 6
    report["blend"] = {str(n): blend_ttft(model, num_queries=queries, num_chunks=n) for n in (8, 16)}
    sixteen = report["blend"]["16"]
    fused = report["kernel_bandwidth"]["ops"]
    report["acceptance"] = {
        "kernel_tests_pass": bool(report["kernel_tests"].get("passed")),
        "dequant_rerotate_fraction_of_copy_bw": max(
            row["fraction_of_copy_bw"] for name, row in fused.items() if "rotate" in name and "dequant" in name),
        "blend_ttft_over_full_at_16": sixteen["ttft_s"]["blend"] / sixteen["ttft_s"]["full"],
    }
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragkv.bench.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=REPO / "research" / "results" / "gpu.json",
                        help="write the report here (default research/results/gpu.json)")
    parser.add_argument("--quick", action="store_true", help="small shapes, 2 blend queries")
    parser.add_argument("--no-tests", action="store_true", help="skip the GPU kernel tests")
    parser.add_argument("--model", default="default")
    args = parser.parse_args(argv)
    report = run(quick=args.quick, model=args.model, tests=not args.no_tests)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    failed = report["kernel_tests"].get("ran") and not report["kernel_tests"].get("passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
