"""`ragkv check [--model default|PATH]`: is blending valid for this model?"""

from __future__ import annotations

import argparse

from ragkv.commands.errors import checked_model
from workers.model import MODEL_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help=MODEL_HELP)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from workers.runner import ModelRunner
    from workers.selfcheck import run_self_check

    runner = ModelRunner.load(checked_model("check", args.model), device=args.device)
    results = run_self_check(runner)
    table = Table(title=f"ragkv self-check: {args.model} (rope {runner.rope_type})")
    for column in ("check", "max error", "tolerance", "result", "detail"):
        table.add_column(column)
    for r in results:
        table.add_row(r.name, f"{r.max_error:.2e}", f"{r.tolerance:.0e}",
                      "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]", r.detail)
    Console().print(table)
    return 0 if all(r.passed for r in results) else 1
