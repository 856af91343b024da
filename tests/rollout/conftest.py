"""Shared helper: import a benchmark script (``benchmarks/<name>.py``) as a module, with ``benchmarks/`` on the
path only while it loads (its sibling imports resolve; nothing leaks into other tests)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_bench(name: str) -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture(scope="session")
def bench_loader() -> Callable[[str], Any]:
    """:func:`load_bench`, as a fixture (test modules here are not a package, so they cannot import it)."""
    return load_bench
