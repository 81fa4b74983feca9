"""Quality runs after the fact.

`python -m ragkv.bench.quality merge A.json B.json --json OUT [--report MD] [--plots DIR]`: one result
from quality runs over disjoint families (`ragkv bench quality --families ...`, one per core).

`python -m ragkv.bench.quality compare RESULT.json [--base full] [--metric correct|agree]`: every config
against `base` on the same prompts: answers gained and lost, the accuracy difference with a 95% interval,
McNemar's p (ragkv/bench/quality/paired.py).

`python -m ragkv.bench.quality tradeoff RESULT.json BLEND.json [--plot PNG]`: accuracy (a quality run) against
TTFT speedup (a `ragkv bench blend` run of the same `METHOD@RATIO` settings), every method in one plot
(ragkv/bench/quality/tradeoff.py).
"""

from __future__ import annotations

import argparse
import json
import sys

from ragkv.bench.quality.paired import OUTCOMES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragkv.bench.quality", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    merge = commands.add_parser("merge", help="one result from runs over disjoint families")
    merge.add_argument("parts", nargs="+", help="quality JSON files of the same split and configs")
    merge.add_argument("--json", required=True, help="write the merged result here")
    merge.add_argument("--report", help="write the Markdown tables here")
    merge.add_argument("--plots", help="write PNG plots here")
    compare = commands.add_parser("compare", help="every config against a base, paired on the same prompts")
    compare.add_argument("result", help="a quality JSON file")
    compare.add_argument("--base", default="full", help="the config the others are compared with (default full)")
    compare.add_argument("--metric", default="correct", choices=OUTCOMES, help="per-prompt outcome to pair")
    tradeoff = commands.add_parser("tradeoff", help="accuracy against TTFT speedup, every blend method")
    tradeoff.add_argument("result", help="a quality JSON file with blend:METHOD@RATIO configs")
    tradeoff.add_argument("ttft", help="a `ragkv bench blend --settings METHOD@RATIO ...` JSON file")
    tradeoff.add_argument("--plot", help="write the PNG here")
    args = parser.parse_args(argv)
    handlers = {"merge": _merge, "compare": _compare, "tradeoff": _tradeoff}
    try:
        return handlers[args.command](args)
    except (ValueError, OSError) as error:  # a bad file or config: one line, exit 2
        parser.exit(2, f"error: {error}\n")


def _load(path: str) -> dict:
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not a quality JSON file: {error}") from None


def _merge(args) -> int:
    from ragkv.bench.quality.report import markdown, write_plots
    from ragkv.bench.quality.suite import merge

    result = merge([_load(path) for path in args.parts])
    if args.plots:
        result["plots"] = write_plots(result, args.plots)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    if args.report:
        with open(args.report, "w") as f:
            f.write(markdown(result))
    return 0


def _compare(args) -> int:
    from ragkv.bench.quality.paired import table

    print("\n".join(table(_load(args.result), args.base, args.metric)))
    return 0


def _tradeoff(args) -> int:
    from ragkv.bench.quality.tradeoff import markdown, plot, tradeoff_points

    result, ttft = _load(args.result), _load(args.ttft)
    points = tradeoff_points(result, ttft)
    split = result.get("split", "?")
    print(markdown(points, split))
    if args.plot:
        title = (f"accuracy ({split}, {result.get('prompts', '?')} prompts) against TTFT "
                 f"({ttft.get('chunks', '?')} chunks, {ttft.get('prompt_tokens', '?')} tokens), codec {result.get('codec', '?')}")
        print(plot(points, args.plot, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
