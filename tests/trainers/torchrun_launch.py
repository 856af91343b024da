"""``agentgym train`` under ``torchrun`` for the sharded tests: one launcher, one clean-up."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_train(config: Path, *overrides: str, nproc: int = 2, timeout_s: float = 400.0) -> tuple[str, float]:
    """Run ``torchrun --nproc_per_node nproc -m agentgym train --config config --set ...`` to the end; returns its
    output and wall-clock, and fails the test on a non-zero exit."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "agentgym", "train",
           "--config", str(config), *[a for o in overrides for a in ("--set", o)]]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1",
                              "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])})
    try:
        out = p.communicate(timeout=timeout_s)[0]
    finally:
        if p.poll() is None:
            # torchrun starts each rank in a session of its own, so killing torchrun's group would orphan them:
            # SIGTERM lets its agent stop the ranks first, then whatever is left of torchrun's group goes
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=60)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        else:
            with contextlib.suppress(ProcessLookupError):  # a rank torchrun left behind
                os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, out[-6000:]
    return out, time.monotonic() - t0
