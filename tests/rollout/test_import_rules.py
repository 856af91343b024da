"""agentgym.rollout, agentgym.eval and agentgym.dataflow are core: they import no env, policy, trainer or heavy backend."""

from __future__ import annotations

import json
import subprocess
import sys


def test_core_packages_import_light() -> None:
    code = ("import sys, json, agentgym.rollout, agentgym.eval, agentgym.cli.eval, agentgym.dataflow.flow, "
            "agentgym.dataflow.service; "
            "print(json.dumps(sorted(m for m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mods = set(json.loads(out.stdout))
    forbidden = [m for m in mods if m.startswith(("agentgym.policies", "agentgym.trainers", "agentgym.envs.",
                                                  "torch", "transformers", "matplotlib", "vllm"))]
    assert forbidden == []
