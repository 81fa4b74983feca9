"""`ragkv bench quality`: the held-out quality suite (families.py, prompts.py, configs.py, evaluate.py,
report.py; the run itself in suite.py). Importing the package is light: torch loads with `run`."""

from __future__ import annotations


def run(**kwargs) -> dict:
    from ragkv.bench.quality.suite import run as run_suite

    return run_suite(**kwargs)
