"""`import agentgym` (and the integrations package) never imports a framework."""

from __future__ import annotations

import subprocess
import sys


def test_frameworks_are_imported_only_by_their_adapter() -> None:
    code = (
        "import sys, agentgym, agentgym.integrations, agentgym.integrations.episode\n"
        "heavy = [m for m in ('trl', 'datasets', 'agents', 'verifiers', 'openenv') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
        "import agentgym.integrations.trl, agentgym.integrations.openai_agents\n"
        "print(','.join(m for m in ('trl', 'agents') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    first, second = out.stdout.splitlines()
    assert first == ""  # nothing heavy at import time
    assert second == ""  # the adapter modules themselves import their framework only when used
