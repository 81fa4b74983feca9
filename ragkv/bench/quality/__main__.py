"""`python -m ragkv.bench.quality merge A.json B.json --json OUT [--report MD] [--plots DIR]`: one result
from quality runs over disjoint families (`ragkv bench quality --families ...`, one per core)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragkv.bench.quality", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["merge"])
    parser.add_argument("parts", nargs="+", help="quality JSON files of the same split and configs")
    parser.add_argument("--json", required=True, help="write the merged result here")
    parser.add_argument("--report", help="write the Markdown tables here")
    parser.add_argument("--plots", help="write PNG plots here")
    args = parser.parse_args(argv)
    from ragkv.bench.quality.report import markdown, write_plots
    from ragkv.bench.quality.suite import merge

    parts = []
    for path in args.parts:
        with open(path) as f:
            parts.append(json.load(f))
    try:
        result = merge(parts)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    if args.plots:
        result["plots"] = write_plots(result, args.plots)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    if args.report:
        with open(args.report, "w") as f:
            f.write(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
