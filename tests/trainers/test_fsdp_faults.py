"""A rank killed mid-run under ``torchrun --nproc_per_node 2 -m agentgym train``: the group fails fast, the run resumes.

Sharded SFT on the tiny model with a checkpoint after every step. Once checkpoint ``step-K`` is complete on disk
(its ``state.json``, written last, is there: see :mod:`agentgym.trainers.checkpoint`), rank 1 is SIGKILLed while
the ranks are in a later step. torchrun's agent must notice, tear the group down and exit non-zero within
seconds (not after the process group's collective timeout), naming the killed rank; the same command then
resumes from the newest complete checkpoint, logs every step exactly once, and ends with the weights an
uninterrupted run ends with.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_fsdp_train import _transcripts
from torchrun_launch import free_port as _free_port

HERE = Path(__file__).resolve().parent
STEPS = 10
KILL_AFTER = 2  # kill once checkpoint step-KILL_AFTER (or later) is complete
EXIT_WITHIN_S = 90.0  # the gloo process group's timeout is 30 minutes: a hang would blow far past this
RUN_TIMEOUT_S = 300.0


def _config(tmp: Path, model: str, out: Path) -> Path:
    data = _transcripts(tmp / "demos.jsonl")
    path = tmp / f"{out.name}.toml"
    path.write_text(f"""
[run]
algorithm = "sft"
out_dir = "{out}"
steps = {STEPS}
seed = 5
checkpoint_every = 1
keep_checkpoints = {STEPS + 1}
[model]
path = "{model}"
finetune = "full"
[optim]
lr = 3e-3
token_budget = 64
[data]
paths = ["{data}"]
batch_size = 5
[rollout]
env = "agentgym/TinyLookup-v0"
imports = ["tiny_lookup"]
[eval]
before = false
after = false
every = 0
[log]
plot = false
progress = false
[trainer]
strategy = "fsdp2"
""")
    return path


class Torchrun:
    """``torchrun --nproc_per_node 2 -m agentgym train --config CONFIG``, its output in a file, its ranks tracked.

    torchrun starts every rank in a session of its own, so killing torchrun's process group does not reach them:
    :meth:`reap` kills torchrun's group and then every rank it saw (the rank and its process group), and
    :meth:`wait` records the ranks while it waits.
    """

    def __init__(self, config: Path) -> None:
        self.config = config
        self.log = config.with_suffix(f".{time.monotonic_ns()}.log")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", "agentgym", "train",
               "--config", str(config)]
        self.ranks: dict[int, int] = {}
        with open(self.log, "w") as fh:
            self.p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                      env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                                           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])})

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def track(self) -> dict[int, int]:
        for rank, pid in _rank_pids(self.p.pid).items():
            self.ranks.setdefault(rank, pid)
        return self.ranks

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or ``None`` if torchrun still runs after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.p.poll() is None and time.monotonic() < deadline:
            self.track()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.p.wait(timeout=0.2)
        return self.p.poll()

    def reap(self) -> None:
        self.track()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, signal.SIGKILL)
        for pid in self.ranks.values():
            try:  # still one of ours (not a reused pid): its command line names our config
                ours = str(self.config).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if ours:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # the rank leads its own session and process group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(timeout=30)


def _run(config: Path) -> tuple[int | None, str]:
    t = Torchrun(config)
    try:
        code = t.wait(RUN_TIMEOUT_S)
    finally:
        t.reap()
    return code, t.output


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _rank_pids(torchrun_pid: int) -> dict[int, int]:
    """{rank: pid} of the workers under torchrun (their environment holds the ``RANK`` the agent gave them)."""
    ranks: dict[int, int] = {}
    for pid in _descendants(torchrun_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                ranks.setdefault(int(kv[5:]), pid)
    return ranks


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _cpu_ticks(pid: int) -> int:
    """The CPU time (user + system, in clock ticks) process ``pid`` has used; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])


def _complete(out: Path) -> list[int]:
    """The steps of the complete checkpoints (a folder with its ``state.json``; a torn write is ``.tmp-*``)."""
    root = out / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "state.json").is_file())


def _train_steps(out: Path) -> list[int]:
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["step"] for r in recs if any(k.startswith("train/") for k in r)]


def _final(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted((out / "final").glob("*.safetensors"))
    assert files, f"no safetensors in {out / 'final'}"
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


@pytest.mark.slow
@pytest.mark.timeout(1200)  # three torchrun runs of up to RUN_TIMEOUT_S each on a loaded machine
def test_rank_killed_mid_step_fails_fast_and_resumes_exactly(tiny_model: str, tmp_path: Path) -> None:
    run = tmp_path / "killed"
    config = _config(tmp_path, tiny_model, run)
    t = Torchrun(config)
    try:
        # wait on the event: checkpoint step-K complete, the ranks in a later step
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not [s for s in _complete(run) if s >= KILL_AFTER]:
            assert t.p.poll() is None, f"torchrun ended (code {t.p.returncode}) before step {KILL_AFTER}:\n" + \
                t.output[-6000:]
            assert time.monotonic() < deadline, f"no checkpoint step-{KILL_AFTER} after {RUN_TIMEOUT_S:.0f} s"
            time.sleep(0.02)
        ranks = t.track()
        assert set(ranks) == {0, 1}, ranks
        # mid-step: rank 1 past the checkpoint's closing barrier (where it sleeps) and computing again
        k = max(_complete(run))
        ticks = _cpu_ticks(ranks[1])
        busy_by = time.monotonic() + 30.0
        while _cpu_ticks(ranks[1]) < ticks + 1 and time.monotonic() < busy_by:
            time.sleep(0.005)
        done_before_kill = _complete(run)
        assert max(done_before_kill) < STEPS, "the run finished before the kill: make the steps longer"
        in_step = max(done_before_kill) == k and not (run / "checkpoints" / f".tmp-step-{k + 1:06d}").exists()
        os.kill(ranks[1], signal.SIGKILL)
        t_kill = time.monotonic()
        code = t.wait(EXIT_WITHIN_S)
        exit_s = time.monotonic() - t_kill
        if code is None:
            pytest.fail(f"torchrun still running {EXIT_WITHIN_S:.0f} s after rank 1 was SIGKILLed (hung in a "
                        f"collective?):\n{t.output[-6000:]}")
        survivors = [pid for pid in ranks.values() if _alive(pid)]  # torchrun gone: did it take its ranks along?
    finally:
        t.reap()
    out = t.output
    assert not survivors, f"ranks {survivors} outlived torchrun"
    assert code != 0, out[-6000:]
    # the agent names the failed rank and the signal that killed it
    assert "ChildFailedError" in out or "FAILED" in out, out[-6000:]
    assert "SIGKILL" in out or "Signal 9" in out or "exitcode  : -9" in out, out[-6000:]
    print("\n".join(x for x in out.splitlines() if "rank" in x or "exitcode" in x or "Error" in x)[-3000:])
    print(f"torchrun exited with {code} {exit_s:.1f} s after the kill (checkpoints complete at the kill: "
          f"{done_before_kill}; rank 1 {'in step ' + str(k + 1) if in_step else 'writing the next checkpoint'}; "
          f"metrics of steps {_train_steps(run)})")

    ck = _complete(run)
    last = max(ck)
    assert last >= KILL_AFTER
    assert last < STEPS and not (run / "final").exists()
    # rank 0's cleanup still writes what it had (the data counts), but no finished run
    if (run / "result.json").exists():  # written unless torchrun's SIGTERM ended rank 0 before its cleanup
        assert "steps" not in json.loads((run / "result.json").read_text())

    # the same command again: resumes from the newest complete checkpoint and finishes
    code, out = _run(config)
    assert code == 0, out[-6000:]
    assert f"resumed from {run / 'checkpoints' / f'step-{last:06d}'} at step {last}" in out, out[-6000:]
    result = json.loads((run / "result.json").read_text())
    assert result["steps"] == STEPS
    assert result["lr_schedule"]["policy"]["optimizer_steps"] == STEPS
    # every step once: the records of steps after the checkpoint (lost with the kill, trained again) were dropped
    assert sorted(_train_steps(run)) == list(range(STEPS)), _train_steps(run)
    assert _train_steps(run) == list(range(STEPS))

    # the same weights as an uninterrupted run of the same config
    ref = tmp_path / "straight"
    code, out = _run(_config(tmp_path, tiny_model, ref))
    assert code == 0, out[-6000:]
    got, want = _final(run), _final(ref)
    assert set(got) == set(want)
    worst = max(float((got[n].float() - want[n].float()).abs().max()) for n in want)
    scale = max(float(want[n].float().abs().max()) for n in want)
    print(f"max |resumed - uninterrupted| = {worst:.3g} (max |w| = {scale:.3g})")
    assert worst <= 1e-6 * scale, (worst, scale)
