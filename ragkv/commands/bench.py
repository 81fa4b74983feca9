"""`ragkv bench codecs|store|blend|eviction|lora|precompute|load|codec-study [--json OUT] [--quick]`."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

SUITES = ("codecs", "store", "blend", "eviction", "lora", "precompute", "load", "codec-study")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", choices=SUITES)
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write the result JSON here")
    parser.add_argument("--quick", action="store_true", help="small version (CI smoke)")
    parser.add_argument("--chunks", type=int, nargs="+", help="blend: chunk counts to run (default 4 8 16)")
    parser.add_argument("--queries", type=int, help="blend: queries per chunk count")
    parser.add_argument("--codec", default="kivi2", help="blend: codec of the stored chunks")
    parser.add_argument("--model", default="default", help="default or a local HF model directory")


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"ragkv.bench.{args.suite.replace('-', '_')}")
    kwargs = {"quick": args.quick}
    if args.suite == "blend":
        kwargs.update(chunk_counts=tuple(args.chunks) if args.chunks else None, num_queries=args.queries,
                      codec=args.codec, model=args.model)
    result = module.run(**kwargs)
    text = json.dumps(result, indent=2, sort_keys=False)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    print(text)
    sys.stdout.flush()
    return 0
