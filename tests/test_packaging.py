"""What the wheel installs: the product's four packages, never research/ (or the tests)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, find_packages

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("client", "kvstore", "ragkv", "workers")


def _find_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]


def installed_packages() -> list[str]:
    """The packages setuptools puts in the wheel: find_packages with the project's include / exclude."""
    find = _find_config()
    return find_packages(str(ROOT), include=find["include"], exclude=find.get("exclude", ()))


def test_the_wheel_holds_the_product_and_not_research():
    packages = installed_packages()
    assert {p.split(".")[0] for p in packages} == set(PRODUCT)
    assert "workers.eviction" in packages and "ragkv.bench.quality" in packages
    assert not [p for p in packages if p.split(".")[0] in ("research", "ragkv_research", "tests")]


def test_research_is_excluded_even_as_a_namespace_package():
    """Were research/ ever found (a namespace scan, an __init__.py added), the exclude list keeps it out."""
    find = _find_config()
    found = find_namespace_packages(str(ROOT), include=[*find["include"], "research*"], exclude=find["exclude"])
    assert not [p for p in found if p.startswith(("research", "ragkv_research"))]
    assert (ROOT / "research" / "ragkv_research").is_dir() and (ROOT / "research" / "pyproject.toml").is_file()


def test_research_declares_the_plugin_entry_point():
    research = tomllib.loads((ROOT / "research" / "pyproject.toml").read_text())
    assert research["project"]["entry-points"]["ragkv.plugins"] == {"research": "ragkv_research.plugin:register"}


def test_the_wheel_holds_every_c_kernel_source_and_header():
    """kvstore/native.py compiles workers' and kvstore's sources on first use where the packages are installed: each
    source and header must be package data."""
    from kvstore import native as build_system
    from workers import native

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package, paths in (("workers", (*native.SOURCES, *native.HEADERS)), ("kvstore", build_system.SOURCES)):
        for path in paths:
            relative = path.relative_to(ROOT / package)
            assert path.is_file() and any(relative.match(g) for g in data[package]), f"{relative} is not package data"
