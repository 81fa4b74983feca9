"""`ragkv calibrate [--model default|PATH] [--codec NAME] [--requests FILE [--namespace NS] [--target 0.9]]`:
measure which blend setting keeps this model's answers.

With `--requests` (JSONL of {question, chunks, system_prompt}: the user's own traffic, no labels), it
measures the agreement of blend with full at each ratio and stores the smallest ratio that reaches the
target (workers/traffic.py). Without it:

Runs the quality suite's dev prompts through full prefill, reuse and every candidate selection
method x ratio (workers/calibration.py), prints the table and stores the cheapest setting that
meets the target next to the model's converted copy; `ragkv serve` then uses it for requests
that give no recompute ratio. A stored result for the same model, codec and prompts is reused
(`--force` measures again).
"""

from __future__ import annotations

import argparse

from ragkv.commands.errors import checked_by, checked_model, flag_error, number_in
from workers.model import MODEL_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help=MODEL_HELP)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--codec", default=None, help="codec of the stored chunks (default: the server's default)")
    parser.add_argument("--per-family", type=int, default=2, help="dev prompts per quality-suite family")
    parser.add_argument("--families", default=None, help="comma-separated families (default: all)")
    parser.add_argument("--methods", default=None, type=_methods,
                        help="comma-separated selection methods (default: all)")
    parser.add_argument("--ratios", default=None, type=_ratios, help="comma-separated recompute ratios")
    parser.add_argument("--force", action="store_true", help="measure again even when a result is stored")
    parser.add_argument("--requests", default=None, type=_existing_file,
                        help="JSONL of logged requests {question, chunks, system_prompt}: calibrate on them")
    parser.add_argument("--namespace", default="", help="with --requests: the namespace the ratio is for")
    parser.add_argument("--target", default=0.9, type=number_in(0, 1, low_open=True),
                        help="with --requests: the agreement with full to reach (default 0.9)")


def _check_methods(text: str) -> None:
    """Each name a registered selection method (BlendConfig checks it against the registry)."""
    from workers.blend import BlendConfig

    for name in text.split(","):
        BlendConfig().named(name)


_methods = checked_by(_check_methods)


def _existing_file(text: str) -> str:
    from pathlib import Path

    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


def _ratios(text: str) -> str:
    try:
        ratios = [float(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not all(0.0 <= r <= 1.0 for r in ratios):
        raise argparse.ArgumentTypeError(f"recompute ratios must be in [0, 1], got {text!r}")
    return text


def candidates(methods: str | None, ratios: str | None):
    from workers.blend import BlendConfig
    from workers.calibration import default_candidates

    configs = default_candidates()
    chosen_methods = methods.split(",") if methods else list(dict.fromkeys(c.method for c in configs))
    chosen_ratios = [float(r) for r in ratios.split(",")] if ratios else sorted({c.recompute_ratio for c in configs})
    return [BlendConfig(recompute_ratio=r, method=m) for m in chosen_methods for r in chosen_ratios]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ragkv.bench.quality.prompts import make_prompts
    from workers.calibration import Target, calibrate, calibration_path
    from workers.runner import ModelRunner

    console = Console()
    checked_model("calibrate", args.model)
    codec = args.codec or _default_codec()
    if args.requests:
        return run_traffic(args, codec, console)
    runner = ModelRunner.load(args.model, device=args.device)
    prompts = make_prompts("dev", lambda text: len(runner.tokenize(text)),
                           args.families.split(",") if args.families else None, per_family=args.per_family)
    record = calibrate(runner, prompts, codec, candidates(args.methods, args.ratios), Target(),
                       force=args.force, progress=lambda line: console.print(line, style="dim"))
    table = Table(title=f"blend calibration: {args.model}, codec {codec}, {len(prompts)} dev prompts")
    for column in ("setting", "accuracy", "agreement vs full", "KL vs full", "compute vs full"):
        table.add_column(column)
    for key, score in record["scores"].items():
        style = "bold green" if key == record["chosen_key"] else None
        table.add_row(key, f"{score['accuracy']:.3f}", f"{score['agreement']:.3f}", f"{score['kl']:.3f}",
                      f"{score['compute_fraction']:.3f}", style=style)
    console.print(table)
    console.print(("reused stored result; " if record["reused"] else "") + record["note"])
    console.print(f"stored at {calibration_path(runner, codec)}")
    return 0


def run_traffic(args: argparse.Namespace, codec: str, console) -> int:
    from rich.table import Table

    from workers.runner import ModelRunner
    from workers.traffic import RATIOS, calibrate_traffic, read_requests

    from workers.errors import InvalidArgument

    try:
        requests = read_requests(args.requests)
    except InvalidArgument as exc:  # one line, exit 2
        raise flag_error("calibrate", f"--requests {args.requests}: {exc}") from None
    ratios = [float(r) for r in args.ratios.split(",")] if args.ratios else RATIOS
    runner = ModelRunner.load(args.model, device=args.device)
    record = calibrate_traffic(runner, requests, codec, ratios, args.target, args.namespace,
                               progress=lambda line: console.print(line, style="dim"))
    table = Table(title=f"agreement with full on {len(requests)} requests ({args.model}, codec {codec}"
                        + (f", namespace {args.namespace!r})" if args.namespace else ")"))
    table.add_column("recompute ratio")
    table.add_column("answers equal to full")
    for ratio, agreement in record["agreement_curve"].items():
        chosen = float(ratio) == record["chosen"]["recompute_ratio"]
        table.add_row(ratio, f"{agreement:.3f}", style="bold green" if chosen else None)
    table.add_row("reuse", f"{record['reuse_agreement']:.3f}")
    console.print(table)
    console.print(record["note"])
    return 0


def _default_codec() -> str:
    from workers.engine import EngineConfig

    return EngineConfig().codec
