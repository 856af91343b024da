"""AgentBench's own OS dev set, scored by the guarded checks (issue 23: honest agents score as before).

AgentBench's data is not shipped (and this machine has no copy), so this test runs only where a checkout is
named: ``AGENTBENCH_OS_DEV=/path/to/AgentBench/data/os_interaction/data/dev.json pytest -m docker
tests/envs/code/test_os_agentbench_dev.py``. The expert answers with each task's reference solution
(its ``example`` script or its ``match``); AgentBench's own scoring of those solutions is 25/26, the miss
being ``dev/8``, whose size checker compares ``int("8.0")``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agentgym.envs.code.os_env import OSEnv

DEV = os.environ.get("AGENTBENCH_OS_DEV")
EXPECTED_MISSES = {"dev/8"}  # AgentBench's size-match.py fails its own reference answer


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.skipif(not DEV, reason="set AGENTBENCH_OS_DEV to AgentBench's data/os_interaction/data/dev.json")
def test_reference_solutions_score_as_in_agentbench(docker_ok: None) -> None:
    assert DEV is not None
    env = OSEnv(path=Path(DEV))
    try:
        ids = [t.task_id for t in env.tasks("test")]
        assert len(ids) == 26, ids
        missed = set()
        for task_id in ids:
            env.reset(options={"task_id": task_id})
            reward = 0.0
            while not env.done:
                _, reward, *_ = env.step(env.expert_action())
            if reward != 1.0:
                missed.add(task_id)
        assert missed == EXPECTED_MISSES, sorted(missed)
    finally:
        env.close()
