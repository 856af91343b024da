"""``agentgym serve-policy`` in a subprocess: an OpenAI client's rollout is recorded and written to ``--out``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "cli-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve-policy exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("serve-policy did not come up")


@pytest.mark.slow
def test_serve_policy_records_rollouts_to_jsonl(tiny_model: str, tmp_path: Path) -> None:
    port, out = free_port(), tmp_path / "traces.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "agentgym", "serve-policy", f"tiny=hf:{tiny_model}", "--port",
                             str(port), "--token", TOKEN, "--parser", "react", "--max-tokens", "6", "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        with openai.OpenAI(base_url=f"{url}/rollout/job-1/v1", api_key=TOKEN, max_retries=0) as client:
            r = client.chat.completions.create(model="whatever", messages=[{"role": "user", "content": "key[owl]"}])
        ids = (r.model_extra or {})["prompt_token_ids"], r.choices[0].model_extra["token_ids"]
        with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            assert c.post(f"{url}/rollout/job-1/reward", json={"value": 1.0}).status_code == 200
            done = c.post(f"{url}/rollout/job-1/finish", json={"task_id": "owl-red"}).json()
            # a second rollout left open is written when the server stops
            c.post(f"{url}/rollout/job-2/v1/completions", json={"model": "tiny", "prompt": "key[elk]"}).raise_for_status()
            assert c.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": []}).status_code == 400
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        if proc.stderr is not None:
            proc.stderr.close()
    assert done["reward"] == 1.0 and done["turns"][0]["completion_token_ids"] == ids[1]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["task_id"], r["reward"]) for r in rows] == [("owl-red", 1.0), ("job-2", 0.0)]
    seg_ids = rows[0]["turns"][0]["prompt_token_ids"] + rows[0]["turns"][0]["completion_token_ids"]
    assert seg_ids == ids[0] + ids[1]


def test_a_public_address_without_a_token_is_refused() -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGENTGYM_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "agentgym", "serve-policy", "hf:smollm2-135m-instruct", "--host",
                        "0.0.0.0"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert r.returncode == 2 and "without a token" in r.stderr
