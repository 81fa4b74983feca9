"""`ragkv serve`: the gRPC server."""

from __future__ import annotations

import argparse
from dataclasses import fields

from kvstore.codecs import CODECS
from ragkv.commands.errors import flag_error
from ragkv.config import BATCH_FIELDS, ENGINE_FIELDS, MiB, ServeConfig
from workers.batching.linear import DECODE_KERNELS
from workers.projections import prefill_kernel_names
from workers.chunk_forms import CHUNK_FORMS


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Defaults are None so that unset flags keep the environment layer (RAGKV_*) or the built-in default.
    d = ServeConfig()
    p.add_argument("--host", help=f"address to bind (default {d.host})")
    p.add_argument("--port", type=int, help=f"port to bind; 0 picks a free one (default {d.port})")
    p.add_argument("--model", help="default (embedded SmolLM2-135M-Instruct) or a local HF model directory")
    p.add_argument("--store", help="disk:PATH or redis://HOST:PORT/DB (default: disk under the cache dir)")
    p.add_argument("--codec", choices=sorted(CODECS),
                   help=f"KV codec (default {d.codec}: the fewest bytes per token that keeps the quality suite's "
                        "answers within 2 points of fp16; README 'Codecs')")
    p.add_argument("--chunk-form", choices=list(CHUNK_FORMS),
                   help=f"how a chunk's KV is computed at ingest (default {d.engine.chunk_form}: after the model's "
                        "template prefix and a bland earlier document, as the second document of a prompt; lead: "
                        "after the template prefix only; alone: CacheBlend's form)")
    p.add_argument("--workers", help="inproc, ray (local cluster), auto (join a running cluster, else inproc) or ray://ADDRESS (default inproc)")
    p.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--memory-budget", type=_size, dest="memory_budget_bytes", metavar="BYTES",
                   help="in-memory tier budget, e.g. 512M or 2G")
    p.add_argument("--token", help="require `authorization: Bearer TOKEN` (or set RAGKV_TOKEN)")
    p.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key (with --tls-cert)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--max-queue", type=int, help=f"requests allowed to wait for the engine (default {d.max_queue})")
    p.add_argument("--max-batch", type=int,
                   help=f"requests decoded together in one forward pass; 1 = one at a time (default {d.max_batch})")
    p.add_argument("--max-batch-tokens", type=int,
                   help="KV tokens (prompt + max_new_tokens) the running batch may hold (default: no limit)")
    p.add_argument("--decode-kernel", choices=sorted(DECODE_KERNELS),
                   help=f"decode-step linear kernel (default {d.decode_kernel}: the model's own 4-bit weights; "
                        "fp32 is exact, slower)")
    p.add_argument("--prefill-kernel", choices=prefill_kernel_names(),
                   help=f"prefill projections (default {d.engine.prefill_kernel}: bf16 weights and activations where "
                        "the hardware has bf16 (about 3x faster on a CPU with AVX512-BF16), else fp32, "
                        "transformers' own arithmetic)")
    p.add_argument("--retain-memory", action=argparse.BooleanOptionalAction,
                   help="keep freed host memory for the next request instead of returning it to the system "
                        f"(default {'on' if d.engine.retain_memory else 'off'}: no page faults per request, about "
                        "20%% off a CPU full prefill; resident memory stays near its peak)")
    p.add_argument("--max-message-bytes", type=_size, metavar="BYTES",
                   help=f"largest request/response (default {d.max_message_bytes // MiB}M)")
    p.add_argument("--grace", type=float, dest="grace_s", metavar="SECONDS",
                   help=f"SIGTERM drain time for in-flight requests (default {d.grace_s:g})")
    p.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="default INFO")


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    names = [f.name for f in fields(ServeConfig) if f.name != "engine"] + list(ENGINE_FIELDS) + list(BATCH_FIELDS)
    return ServeConfig.from_env().with_overrides(**{n: getattr(args, n, None) for n in names})


def check_paths(config: ServeConfig) -> None:
    """What can be checked before the model loads: the store URL's scheme, a --model directory."""
    from kvstore.backends.registry import url_scheme
    from workers.model import DEFAULT_MODEL, resolve_model_dir

    try:
        url_scheme(config.store_url)
    except ValueError as e:
        raise ValueError(f"--store: {e}") from e
    if config.model != DEFAULT_MODEL:
        resolve_model_dir(config.model)  # FileNotFoundError names --model


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        check_paths(config)
    except (ValueError, FileNotFoundError) as e:
        raise flag_error("serve", str(e)) from e
    from ragkv.server import logs
    from ragkv.server.app import serve

    from kvstore.codecs import CodecError

    logs.configure(config.log_level)
    try:
        return serve(config)
    except CodecError as e:  # the codec does not fit the loaded model (e.g. a rotated codec, head_dim 80)
        raise flag_error("serve", f"--codec: {e}") from e
