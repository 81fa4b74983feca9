"""Batch precompute job: chunk a corpus and store every chunk's KV, fanned out over Ray worker actors.

    python -m ragkv.jobs.precompute --corpus DIR --store redis://HOST:6379/0 \\
        [--chunk-tokens 256] [--codec NAME (default: the engine's)] [--workers N] [--namespace NS] [--model default]
        [--chunk-form lead|alone] [--prefill-kernel bf16|fp32]

Prints one summary JSON line, {"precompute": {...}}. Under `ray job submit` it joins the job's
cluster; run directly it starts a local one (or joins RAY_ADDRESS). The work is
workers/precompute.py:run.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from workers.chunk_forms import CHUNK_FORMS
from workers.chunking import DEFAULT_CHUNK_TOKENS
from workers.engine import EngineConfig
from workers.precompute import run
from workers.projections import prefill_kernel_names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ragkv.jobs.precompute", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", required=True, help="directory of *.txt and *.jsonl (field `text`) files")
    p.add_argument("--store", required=True, help="redis://HOST:PORT/DB (cluster) or disk:PATH (one node)")
    p.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    p.add_argument("--codec", default=EngineConfig.codec)
    p.add_argument("--workers", type=int, default=None, help="actors (default: GPUs, else CPUs/4, at least 1)")
    p.add_argument("--namespace", default="")
    p.add_argument("--model", default=EngineConfig.model)
    p.add_argument("--chunk-form", choices=list(CHUNK_FORMS), default=EngineConfig.chunk_form,
                   help="as the server's --chunk-form (part of every block's address)")
    p.add_argument("--prefill-kernel", choices=prefill_kernel_names(), default=EngineConfig.prefill_kernel,
                   help="as the server's --prefill-kernel (part of every block's address)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    summary = run(args.corpus, args.store, args.chunk_tokens, args.codec, args.workers, args.namespace,
                  args.model, progress=not args.no_progress, chunk_form=args.chunk_form,
                  prefill_kernel=args.prefill_kernel)
    print(json.dumps({"precompute": asdict(summary)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
