"""``agentgym eval`` / ``agentgym report`` run as a user would: in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAKES = str(Path(__file__).resolve().parents[1] / "rollout")


def env_vars() -> dict[str, str]:
    return {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": FAKES}


def run(*args: str, timeout: int = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentgym", *args], capture_output=True, text=True, timeout=timeout,
                          env=env_vars())


def test_eval_demo_expert_then_resume_then_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["eval", "--env", "agentgym/Demo-v0", "--policy", "expert", "--split", "test", "--tasks", "3",
            "--samples", "2", "--seeds", "0,1", "--max-turns", "8", "--out", str(out), "-q"]
    r = run(*args)
    assert r.returncode == 0, r.stderr
    # 12 of 12 episodes, every task solved: a Wilson interval, not a zero-width one
    assert "Demo-v0" in r.stdout and "100.0% [75.7, 100.0]" in r.stdout and "pass@2=100.0%" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    b = summary["envs"]["agentgym/Demo-v0"]
    assert b["episodes"] == 12 and b["success"]["mean"] == 1.0
    assert summary["protocol"]["policy"]["spec"] == "expert" and summary["protocol"]["max_turns"] == {"agentgym/Demo-v0": 8}
    n_lines = len((out / "episodes.jsonl").read_text().splitlines())
    r = run(*args)  # resume: nothing to do
    assert r.returncode == 0 and len((out / "episodes.jsonl").read_text().splitlines()) == n_lines == 12
    rep = tmp_path / "rep"
    r = run("report", str(out), "--out", str(rep))
    assert r.returncode == 0, r.stderr
    assert "| agentgym/Demo-v0 | 100.0% [" in r.stdout
    assert {p.name for p in rep.iterdir()} == {"report.md", "success_by_env.png", "success_by_task_type.png",
                                               "success_by_turns.png"}


@pytest.mark.parametrize(("extra", "message"), [
    (["--env", "agentgym/Demo-v9"], "Did you mean 'agentgym/Demo-v0'"),
    (["--env", "agentgym/Demo-v0", "--seeds", "a,b"], "seeds must be integers"),
    (["--env", "agentgym/Demo-v0", "--tasks", "0"], "--tasks: Input should be greater than or equal to 1"),
    (["--env", "agentgym/Demo-v0", "--split", "nope"], "has no split 'nope'"),
    (["--env", "agentgym/Demo-v0", "--history", "lots"], "--history: must be 'full' or a number"),
    (["--env", "agentgym/Demo-v0", "--parser", "xml"], "unknown parser 'xml'"),
    (["--env", "agentgym/Demo-v0", "--policy", "py:nosuchmodule:x"], "cannot import x from nosuchmodule"),
    (["--env", "agentgym/Demo-v0", "--env-workers", "fork"], "--env-workers: Input should be 'thread' or 'process'"),
])
def test_invalid_arguments_get_clear_messages(tmp_path: Path, extra: list[str], message: str) -> None:
    args = ["eval", "--policy", "expert", "--out", str(tmp_path / "o"), "-q", *extra]
    r = run(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr


def test_envs_in_worker_processes_give_the_same_results(tmp_path: Path) -> None:
    outs = {}
    for workers in ("thread", "process"):
        out = tmp_path / workers
        r = run("eval", "--env", "agentgym/Demo-v0", "--policy", "expert", "--split", "test", "--tasks", "4",
                "--env-workers", workers, "--out", str(out), "-q")
        assert r.returncode == 0, r.stderr
        # timings differ from run to run; everything else an episode records must not
        outs[workers] = sorted((e["task_id"], e["reward"], [{k: v for k, v in t.items() if k != "timing"} for t in e["turns"]])
                               for e in map(json.loads, (out / "episodes.jsonl").read_text().splitlines()))
    assert outs["thread"] == outs["process"] and len(outs["thread"]) == 4


def test_report_on_a_non_run_directory(tmp_path: Path) -> None:
    r = run("report", str(tmp_path), "--out", str(tmp_path / "rep"))
    assert r.returncode == 2 and "no summary.json" in r.stderr


@pytest.mark.slow
def test_ctrl_c_leaves_resumable_output(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [sys.executable, "-m", "agentgym", "eval", "--env", "agentgym/Demo-v0", "--policy",
            "py:rollout_fakes:slow_expert", "--tasks", "12", "--concurrency", "2", "--out", str(out), "-q"]
    # SIGINT at its default, as in a terminal: a test run started as a background job (`make test &`) inherits
    # SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_vars(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    episodes = out / "episodes.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (episodes.exists() and len(episodes.read_text().splitlines()) >= 2):
        time.sleep(0.1)
    assert proc.poll() is None, "the eval ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "rerun the same command to resume" in " ".join(err.split())
    summary = json.loads((out / "summary.json").read_text())
    done = summary["finished_episodes"]
    assert summary["complete"] is False and 2 <= done < 12
    r = subprocess.run(args, capture_output=True, text=True, timeout=180, env=env_vars())
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["finished_episodes"] == 12
    assert summary["envs"]["agentgym/Demo-v0"]["success"]["mean"] == 1.0
    assert len(episodes.read_text().splitlines()) == 12  # finished episodes were not run again


# ------------------------------------------------------------------------------ dead and hung servers (issue 11)
class _HungServer:
    """Accepts TCP connections on 127.0.0.1 and never answers (a wedged model server)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.conns.append(conn)  # hold it open, read nothing, answer nothing
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_hung_server_is_bounded_by_request_timeout_and_reported(tmp_path: Path) -> None:
    srv = _HungServer()
    try:
        t0 = time.monotonic()
        r = run("eval", "--env", "agentgym/Demo-v0", "--policy", f"openai:http://127.0.0.1:{srv.port}/v1#m",
                "--tasks", "3", "--request-timeout", "1", "--out", str(tmp_path / "o"), "-q", timeout=120)
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert took < 40, f"the eval against a hung server took {took:.0f} s with --request-timeout 1"
    assert r.returncode == 1, (r.returncode, r.stderr)
    msg = " ".join(r.stderr.split())
    assert "every episode failed" in msg and "3 of 3" in msg, msg


def test_a_dead_server_fails_the_eval_clearly(tmp_path: Path) -> None:
    r = run("eval", "--env", "agentgym/Demo-v0", "--policy", f"openai:http://127.0.0.1:{_free_port()}/v1#m",
            "--tasks", "2", "--request-timeout", "2", "--out", str(tmp_path / "o"), "-q", timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr)
    msg = " ".join(r.stderr.split())
    assert "every episode failed" in msg and "2 of 2" in msg, msg
    assert "Traceback" not in r.stderr


def test_deadline_stops_the_run_and_it_resumes(tmp_path: Path) -> None:
    srv = _HungServer()
    out = tmp_path / "o"
    try:
        t0 = time.monotonic()
        r = run("eval", "--env", "agentgym/Demo-v0", "--policy", f"openai:http://127.0.0.1:{srv.port}/v1#m",
                "--tasks", "2", "--deadline", "3", "--out", str(out), "-q", timeout=120)
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert took < 40 and r.returncode == 3, (took, r.returncode, r.stderr)
    assert "deadline reached" in " ".join(r.stderr.split())
    assert json.loads((out / "summary.json").read_text())["complete"] is False
    r = run("eval", "--env", "agentgym/Demo-v0", "--policy", "expert", "--tasks", "2", "--out", str(tmp_path / "o2"),
            "--deadline", "120", "-q")
    assert r.returncode == 0, r.stderr


def test_bad_timeouts_are_rejected(tmp_path: Path) -> None:
    for opt in ("--request-timeout", "--deadline"):
        r = run("eval", "--env", "agentgym/Demo-v0", "--policy", "expert", "--out", str(tmp_path / "o"), opt, "0", "-q")
        assert r.returncode == 2 and f"{opt}: Input should be greater than 0" in " ".join(r.stderr.split()), r.stderr


def test_eval_records_and_prints_loaded_and_skipped_tasks(tmp_path: Path) -> None:
    medals = {"table_name": "Medals", "table_info": {"columns": [{"name": "Nation", "type": "TEXT"},
                                                                 {"name": "Gold", "type": "INT"}],
                                                     "rows": [["Norway", "16"], ["Chile", "2"]]}}
    rows = [
        {"description": "Which nation won 16 gold medals?", "label": ["Norway"], "table": medals, "type": ["other"]},
        {"description": "How many nations?", "label": ["2"], "table": medals, "type": ["counting"]},
        {"description": "No label here.", "table": medals, "type": ["other"]},
        {"description": "Rename Chile.", "label": ["UPDATE Medals SET Nation = SUBSTRING_INDEX(Nation, 'l', 1)"], "table": medals,
         "type": ["UPDATE"], "answer_md5": "[('0',)]"},
    ]
    data = tmp_path / "dbbench.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "run"
    r = run("eval", "--env", "agentgym/SQL-AgentBench-v0", "--env-kwarg", f"path={data}", "--policy", "expert",
            "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    assert ("SQL-AgentBench-v0: tasks: 2 loaded, 2 evaluated, 2 skipped (1 x select row without a label; "
            "1 x gold SQL fails in SQLite: MySQL-only function SUBSTRING_INDEX())") in r.stdout
    tasks = json.loads((out / "summary.json").read_text())["envs"]["agentgym/SQL-AgentBench-v0"]["tasks"]
    assert tasks["loaded"] == 2 and tasks["skipped"] == 2 and tasks["evaluated"] == 2
    assert [i["item"] for i in tasks["skipped_items"]] == ["row 2 (other)", "row 3 (UPDATE)"]
    assert "SQL-AgentBench-v0: loaded 2 task(s)" in r.stderr and "skipped 2" in r.stderr  # the loader's WARNING
