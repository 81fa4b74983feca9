"""`ragkv` console script: a small argparse dispatcher.

Each subcommand is a module `ragkv.commands.NAME` with `add_arguments(parser)` (optional)
and `run(args) -> int | None`. Only the module of the command being run is imported, so
`ragkv serve --help` does not pay for the benchmarks' imports and vice versa.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from ragkv import __version__
from ragkv.commands.bench import SUITES as BENCH_SUITES  # a light module: the list, not the benchmarks

COMMANDS: dict[str, tuple[str, str]] = {  # name -> (module, one-line help)
    "serve": ("ragkv.commands.serve", "run the gRPC server"),
    "demo": ("ragkv.commands.demo", "the main job on the embedded default model"),
    "bench": ("ragkv.commands.bench", "benchmarks: " + " | ".join(BENCH_SUITES)),
    "check": ("ragkv.commands.check", "self-check: is blending valid for this model"),
    "calibrate": ("ragkv.commands.calibrate", "measure and store this model's blend setting"),
}


class OneLineParser(argparse.ArgumentParser):
    """A bad flag is one line on stderr and exit 2 (`--help` still shows the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported to add its arguments."""
    parser = OneLineParser(prog="ragkv", description="Distributed KV-cache service for RAG.")
    parser.add_argument("--version", action="version", version=f"ragkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=OneLineParser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            add = getattr(importlib.import_module(module), "add_arguments", None)
            if add is not None:
                add(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    rc = importlib.import_module(COMMANDS[args.command][0]).run(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
