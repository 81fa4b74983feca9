"""`ragkv demo` (placeholder until the real command lands)."""

from __future__ import annotations

import argparse

HELP = "demo (not implemented yet)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("not implemented yet")
