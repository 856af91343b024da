"""Interpreters of the side venvs some harness tests drive (their packages conflict with the main venv's)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def side_python(env_var: str, venv: str, imports: str, version_of: str, version: str, missing: str,
                timeout_s: float = 300) -> str:
    """``$env_var`` or ``ROOT/venv/bin/python``, checked to import ``imports`` with ``version_of.__version__ ==
    version``; the test skips (saying ``missing``) where the venv is absent or cannot import them."""
    py = os.environ.get(env_var) or str(ROOT / venv / "bin" / "python")
    if not Path(py).is_file():
        pytest.skip(f"{missing}; none at {py}")
    r = subprocess.run([py, "-c", f"import {imports}; print({version_of}.__version__)"],
                       capture_output=True, text=True, timeout=timeout_s, check=False)
    if r.returncode != 0:
        pytest.skip(f"{py} cannot import {imports}: {r.stderr[-300:]}")
    assert r.stdout.strip() == version
    return py
