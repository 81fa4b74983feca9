"""A bad flag or path on the command line: one line on stderr naming the flag, exit status 2."""

from __future__ import annotations

import argparse
import sys
from typing import Callable


class FlagError(SystemExit):
    """Exit status 2 (argparse's for usage errors); str() is the one-line message."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def flag_error(command: str, message: str) -> FlagError:
    """Print `ragkv COMMAND: MESSAGE` on stderr and return the FlagError to raise."""
    error = FlagError(f"ragkv {command}: {message}")
    print(error.message, file=sys.stderr)
    return error


def checked_model(command: str, source: str) -> str:
    """--model's value when ragkv serves it (a named model, or a directory of a supported architecture), else
    one line naming the architecture and the supported ones, exit 2; nothing is loaded."""
    from workers.model import check_model_source

    try:
        return check_model_source(source)
    except (ValueError, FileNotFoundError) as e:
        raise flag_error(command, str(e)) from e


def checked_by(parse: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type: the text when `parse(text)` accepts it, else its ValueError as the flag's one-line
    error (`parse` imports what it needs on use: torch loads only when the flag is given)."""
    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    return check


def number_in(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a number in [low, high] (`low_open`: (low, high]), else one line saying so."""
    def check(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (low < value <= high if low_open else low <= value <= high):
            raise argparse.ArgumentTypeError(f"expected a number in {'(' if low_open else '['}{low:g}, {high:g}], "
                                             f"got {text!r}")
        return value
    return check
