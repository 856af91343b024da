"""Fixtures for the Docker-backed OS-v0 tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def docker_ok() -> None:
    """Skip unless a Docker engine answers."""
    from agentgym.envs.code.os_shell import docker_client

    from agentgym.errors import DependencyNotInstalled, SandboxUnavailable

    try:
        docker_client(timeout=10).close()
    except (SandboxUnavailable, DependencyNotInstalled) as e:
        pytest.skip(f"no Docker engine: {e}")
