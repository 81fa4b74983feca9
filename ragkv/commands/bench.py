"""`ragkv bench SUITE [--json OUT] [--quick]`, SUITE one of SUITES."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from ragkv.bench.quality.presets import PRESETS  # names only: no torch
from ragkv.commands.errors import checked_by, checked_model, number_in
from workers.model import MODEL_HELP
from workers.projections import prefill_kernel_names

SUITES = ("codecs", "store", "blend", "eviction", "quality", "serve", "lora", "precompute", "load")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", choices=SUITES)
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write the result JSON here")
    parser.add_argument("--quick", action="store_true", help="small version (CI smoke)")
    parser.add_argument("--chunks", type=int, nargs="+", help="blend: chunk counts to run (default 4 8 16)")
    parser.add_argument("--queries", type=int, help="blend: queries per chunk count (per workload)")
    parser.add_argument("--chunk-tokens", type=_positive, help="blend: tokens per chunk (default 256; 128: ~1,100-token "
                                                                "prompts at 8 chunks)")
    parser.add_argument("--workload", choices=("synthetic", "same-docs", "zipf"), default="synthetic",
                        help="blend: synthetic (every mode on fresh queries), same-docs (same documents, another "
                             "question, through the SDK), zipf (popular chunks leading): with and without the "
                             "exact sequence tree")
    parser.add_argument("--settings", nargs="+", metavar="METHOD@RATIO", type=_setting,
                        help="blend: extra blend settings measured side by side (e.g. deviation@0.15)")
    parser.add_argument("--codec", help="blend, quality: codec of the stored chunks (default: the engine's)")
    parser.add_argument("--model", default="default", help=MODEL_HELP)
    parser.add_argument("--prefill-kernel", choices=prefill_kernel_names(),
                        help="blend, quality: the prefill projections (default: the engine's)")
    parser.add_argument("--max-batch", type=_positive, help="serve: the batched server's --max-batch (default 16)")
    parser.add_argument("--recompute-ratio", type=number_in(0, 1), metavar="R",
                        help="serve: both servers' --recompute-ratio (default: the server's, served exactly)")
    parser.add_argument("--api", choices=("grpc", "http"), default="grpc",
                        help="serve: http = TTFT through the OpenAI-compatible HTTP API beside gRPC, in one run")
    quality = parser.add_argument_group("quality")
    quality.add_argument("--split", choices=("dev", "test"), default="dev",
                         help="quality: dev for choosing defaults, test (held out) for quoted figures")
    quality.add_argument("--families", type=_families, help="quality: comma-separated families (default all)")
    quality.add_argument("--per-family", type=_positive, help="quality: prompts per family and size")
    quality.add_argument("--sizes", type=int, nargs="+", choices=(500, 1100, 2000),
                         help="quality: prompt sizes in tokens (default 1100; 500 with --quick)")
    quality.add_argument("--configs", nargs="+", type=_configs, help="quality: configurations (full, reuse, blend@0.3, codec:int4, "
                                                      "policy:snapkv@0.2[:noprot], ...)")
    quality.add_argument("--preset", choices=sorted(PRESETS),
                         help="quality: a named configuration set (default: standard; quick with --quick)")
    quality.add_argument("--answer-tokens", type=_positive, metavar="N",
                         help="quality: answer length for every family instead of each family's own (a diagnostic: "
                              "does a miss lose the fact, or state it after the family's limit?)")
    quality.add_argument("--plots", metavar="DIR", help="quality, serve: write PNG plots here")
    quality.add_argument("--report", metavar="MD", help="quality: write the Markdown tables here")


def _families(text: str) -> list[str]:
    from ragkv.bench.quality.families import FAMILIES  # no torch

    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in FAMILIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown families {unknown}; expected some of {', '.join(FAMILIES)}")
    return names


def _parse_config(text: str):
    from ragkv.bench.quality.configs import parse_config

    return parse_config(text)


def _parse_setting(text: str):
    from ragkv.bench.blend import parse_setting

    return parse_setting(text)


_configs = checked_by(_parse_config)
_setting = checked_by(_parse_setting)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    checked_model("bench", args.model)
    module = importlib.import_module(f"ragkv.bench.{args.suite.replace('-', '_')}")
    kwargs = {"quick": args.quick}
    if args.suite == "blend":
        kwargs.update(chunk_counts=tuple(args.chunks) if args.chunks else None, num_queries=args.queries,
                      model=args.model, settings=tuple(args.settings or ()), prefill_kernel=args.prefill_kernel,
                      chunk_tokens=args.chunk_tokens, workload=args.workload,
                      **({"codec": args.codec} if args.codec else {}))
    if args.suite == "quality":
        kwargs.update(split=args.split, families=args.families, per_family=args.per_family,
                      sizes=tuple(args.sizes) if args.sizes else None, configs=args.configs, preset=args.preset,
                      codec=args.codec, answer_tokens=args.answer_tokens,
                      plots=args.plots, report=args.report, model=args.model, prefill_kernel=args.prefill_kernel)
    if args.suite == "serve" and args.api == "http":  # HTTP beside gRPC, one server (ragkv/bench/serve_http.py)
        module = importlib.import_module("ragkv.bench.serve_http")
    elif args.suite == "serve":
        kwargs.update(plots=args.plots, recompute_ratio=args.recompute_ratio,
                      **({"max_batch": args.max_batch} if args.max_batch else {}))
    result = module.run(**kwargs)
    text = json.dumps(result, indent=2, sort_keys=False)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    print(text)
    sys.stdout.flush()
    return 0
