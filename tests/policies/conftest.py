"""Shared fixtures: the real SmolLM2 model under HF, in-process vLLM, and a `vllm serve` process.

Each heavy fixture is session-scoped (one engine / server per test session) and cleans up after
itself. The vLLM ones use a small KV cache and eager mode so they start in ~30-60 s on a CPU.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

SERVED_NAME = "smollm2"


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from agentgym.policies.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def hf_policy(smollm2_path: str) -> Any:
    from agentgym.policies.hf import HFPolicy

    return HFPolicy(smollm2_path, max_batch_size=8, context_length=2048, dtype="float32")  # fp32: exact batch tests


@pytest.fixture(scope="session")
def vllm_policy(smollm2_path: str) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from agentgym.policies.vllm import VLLMPolicy

    # enable_lora: test_vllm_weights serves an adapter (and drops it again) on this one engine
    policy = VLLMPolicy(smollm2_path, kv_cache_gib=1, max_model_len=2048, max_num_seqs=16, startup_timeout_s=600,
                        enable_lora=True, max_lora_rank=8)
    yield policy
    policy.shutdown()


@pytest.fixture(scope="session")
def vllm_server(smollm2_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `vllm serve` of SmolLM2 on 127.0.0.1; yields the base URL (``.../v1``).

    Dev mode (``/collective_rpc``, ``/pause``, ``/update_weight_version``, ...) and AgentGym's worker
    extension are on, with this process's weights key, so weights can be published to it
    (tests/policies/test_vllm_weights.py).
    """
    pytest.importorskip("vllm")
    port = free_port()
    log = Path(tmp_path_factory.mktemp("vllm-serve")) / "server.log"
    from agentgym.weights import KEY_ENV, shared_key

    key = shared_key(create=True)  # the publisher's key (this process's): the worker applies only what it signs
    assert key is not None
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_SERVER_DEV_MODE": "1",
           KEY_ENV: key.decode(), "VLLM_RPC_BASE_PATH": str(log.parent)}  # its IPC sockets: not left in /tmp
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", smollm2_path, "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "16", "--enforce-eager",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--worker-extension-cls", "agentgym.policies.vllm_worker.WeightWorkerExtension",
    ]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve not ready after 600 s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
