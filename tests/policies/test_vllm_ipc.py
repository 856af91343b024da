"""Where vLLM's engine puts its ZMQ IPC socket files: a folder of the process's own, removed when it exits.

vLLM binds them as files in ``VLLM_RPC_BASE_PATH`` (default: the temp dir) and never removes them; before this,
every VLLMPolicy started left 7 socket files in /tmp, even after a clean shutdown."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# what a VLLMPolicy does before its engine starts, then a socket bound there as vLLM's would be; exit without cleanup
SCRIPT = """
import os, socket, uuid
import agentgym.policies.vllm as v
v._private_rpc_dir()
folder = os.environ.get("VLLM_RPC_BASE_PATH", "")
if folder:
    socket.socket(socket.AF_UNIX).bind(os.path.join(folder, str(uuid.uuid4())))
print(folder)
"""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir short enough for socket paths (pytest's tmp_path under xdist is not)."""
    with tempfile.TemporaryDirectory(prefix="ipc-") as d:
        yield Path(d)


def _run(tmp_path: Path, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env={**base, "TMPDIR": str(tmp_path), **env},
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_the_socket_folder_is_private_and_removed_at_exit(short_tmp: Path) -> None:
    folder = Path(_run(short_tmp))
    assert folder.parent == short_tmp and folder.name.startswith("agentgym-ipc-")
    assert not folder.exists()
    assert list(short_tmp.iterdir()) == []  # nothing left in the temp dir either


def test_a_folder_the_user_set_is_kept(short_tmp: Path) -> None:
    mine = short_tmp / "mine"
    mine.mkdir()
    assert _run(short_tmp, VLLM_RPC_BASE_PATH=str(mine)) == str(mine)
    assert mine.is_dir() and len(list(mine.iterdir())) == 1  # not ours to remove


def test_a_temp_dir_too_deep_for_socket_paths_keeps_vllms_default(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    assert _run(deep) == ""  # not set: vLLM's own default applies
    assert list(deep.iterdir()) == []


@pytest.mark.slow
@pytest.mark.vllm
def test_the_engine_binds_its_sockets_in_that_folder(vllm_policy: Any) -> None:
    from agentgym.policies import vllm

    if vllm._RPC_DIR is None:
        pytest.skip("VLLM_RPC_BASE_PATH was set before the engine started: the user's folder is used")
    folder = Path(os.environ["VLLM_RPC_BASE_PATH"])
    assert folder == Path(vllm._RPC_DIR) and folder.name.startswith("agentgym-ipc-")
    sockets = [p for p in folder.iterdir() if stat.S_ISSOCK(p.stat().st_mode)]
    assert len(sockets) >= 2, sorted(folder.iterdir())  # the engine's input and output sockets at least
