"""`ragkv serve`: the gRPC server (and the OpenAI-compatible HTTP API with --http-port)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from kvstore.codecs import CODECS
from kvstore.plugins import HINT
from ragkv.commands.errors import checked_by, flag_error
from ragkv.config import BATCH_FIELDS, BLEND_FIELDS, ENGINE_FIELDS, ServeConfig
from workers.batching.linear import DECODE_KERNELS
from workers.projections import prefill_kernel_names
from workers.chunk_forms import CHUNK_FORMS
from workers.model import MODEL_HELP
from workers.prompt import template_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags, in groups. Rarely needed settings (--device, --max-queue, --max-batch-tokens, --retain-memory,
    --max-message-bytes, --grace) live in the --config file (or RAGKV_*); they stay accepted as flags for
    existing scripts, not listed. Defaults are None so that unset flags keep the lower layers."""
    d = ServeConfig()
    p.add_argument("--config", metavar="FILE",
                   help="TOML file of settings by field name (e.g. max_queue = 128); layered defaults -> file -> "
                        "RAGKV_* environment -> flags (docs/service.md)")
    net = p.add_argument_group("network and security")
    net.add_argument("--host", help=f"address to bind (default {d.host})")
    net.add_argument("--port", type=int, help=f"port to bind; 0 picks a free one (default {d.port})")
    net.add_argument("--http-port", type=int,
                     help="serve the OpenAI-compatible HTTP API on this port beside gRPC (docs/openai.md; default off)")
    net.add_argument("--token", help="require `authorization: Bearer TOKEN` (or set RAGKV_TOKEN)")
    net.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key)")
    net.add_argument("--tls-key", help="PEM private key (with --tls-cert)")
    store = p.add_argument_group("model and store")
    store.add_argument("--model", help=MODEL_HELP)
    store.add_argument("--prompt-template", metavar="FILE", type=checked_by(template_file),
                       help="Jinja chat template replacing the model's own, in every mode (default: the model's; "
                            "a model without one gets a plain documents-then-question template)")
    store.add_argument("--store", help="disk:PATH or redis://HOST:PORT/DB (default: disk under the cache dir)")
    store.add_argument("--codec", metavar="NAME", type=_codec,
                       help=f"KV codec: {', '.join(sorted(CODECS))} (default {d.codec}: the fewest bytes per token "
                            "that keeps the quality suite's answers within 2 points of fp16; docs/benchmarks.md)")
    store.add_argument("--workers", help="inproc, ray (local cluster), auto (join a running cluster, else inproc) or "
                                         "ray://ADDRESS (default inproc)")
    store.add_argument("--memory-budget", type=_size, dest="memory_budget_bytes", metavar="BYTES",
                       help="in-memory tier budget, e.g. 512M or 2G")
    blend = p.add_argument_group("blend and quality")
    blend.add_argument("--recompute-ratio", type=float, metavar="R",
                       help=f"share of stored chunk tokens blend recomputes for requests that give no ratio (default "
                            f"{d.recompute_ratio}: the cheapest within 2 points of full's accuracy on the quality "
                            "suite's dev split, so served exactly, see --exact-from; 0.15 is ~3x faster and less "
                            "exact; a stored `ragkv calibrate` result for the model or namespace comes first; "
                            "docs/prefill.md)")
    blend.add_argument("--exact-from", type=float, metavar="R",
                       help=f"a server ratio at or above R is served by an exact prefill instead of blending (default "
                            f"{d.engine.blend.exact_from}: from there blending saves too little of the prefill; the "
                            "exact prefill stores the document sequence, read exactly the next time; 1 = blend at "
                            "every ratio below 1; a request's own recompute_ratio always runs as asked)")
    blend.add_argument("--chunk-form", choices=list(CHUNK_FORMS),
                       help=f"how a chunk's KV is computed at ingest (default {d.engine.chunk_form}: after the "
                            "model's template prefix and a bland earlier document; lead: after the template prefix "
                            "only; alone: CacheBlend's form)")
    perf = p.add_argument_group("performance")
    perf.add_argument("--prefill-kernel", choices=prefill_kernel_names(),
                      help=f"prefill projections (default {d.engine.prefill_kernel}: bf16-attention on a CPU with "
                           "AVX512-BF16, bf16 where the hardware has it otherwise, else fp32; fp32 = transformers' own "
                           "arithmetic; bf16-attention = bf16 with attention in bf16 arithmetic too)")
    perf.add_argument("--decode-kernel", choices=sorted(DECODE_KERNELS),
                      help=f"decode-step linear kernel (default {d.decode_kernel}: the model's own 4-bit weights; "
                           "fp32 is exact, slower)")
    perf.add_argument("--max-batch", type=int,
                      help=f"requests decoded together in one forward pass; 1 = one at a time (default {d.max_batch})")
    obs = p.add_argument_group("observability")
    obs.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    obs.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="default INFO")
    obs.add_argument("--shadow-sample", type=float, metavar="FRACTION",
                     help="share of greedy blend requests re-checked against a full prefill while idle, "
                          "agreement in Stats and metrics (default 0: off; docs/prefill.md)")
    # in the config file (also accepted as flags, not listed)
    hidden = argparse.SUPPRESS
    p.add_argument("--device", help=hidden)
    p.add_argument("--max-queue", type=int, help=hidden)
    p.add_argument("--max-batch-tokens", type=int, help=hidden)
    p.add_argument("--retain-memory", action=argparse.BooleanOptionalAction, help=hidden)
    p.add_argument("--sequence-cache", action=argparse.BooleanOptionalAction, help=hidden)
    p.add_argument("--max-message-bytes", type=_size, metavar="BYTES", help=hidden)
    p.add_argument("--grace", type=float, dest="grace_s", metavar="SECONDS", help=hidden)


def _codec(name: str) -> str:
    """A registered codec (a plug-in's too: CODECS loads them on a miss), else the flag's one-line error."""
    if name not in CODECS:
        raise argparse.ArgumentTypeError(f"unknown codec {name!r}; known: {', '.join(sorted(CODECS))}; {HINT}")
    return name


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    names = [f.name for f in fields(ServeConfig) if f.name != "engine"] + list(ENGINE_FIELDS) + list(BATCH_FIELDS) + \
        list(BLEND_FIELDS)
    return ServeConfig.load(getattr(args, "config", None)).with_overrides(**{n: getattr(args, n, None) for n in names})


def check_paths(config: ServeConfig) -> None:
    """What can be checked before the model loads: the store URL's scheme, a --model directory."""
    from kvstore.backends.registry import url_scheme
    from workers.model import check_model_source

    try:
        url_scheme(config.store_url)
    except ValueError as e:
        raise ValueError(f"--store: {e}") from e
    check_model_source(config.model)  # FileNotFoundError or UnsupportedModel, naming --model


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
