"""Fixtures: one sandbox per available backend (docker only when the engine answers)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from agentgym.sandbox import Sandbox, get_sandbox

SANDBOX_LABEL = "agentgym.sandbox"

BACKEND_PARAMS = [
    pytest.param("bwrap", id="bwrap"),
    pytest.param("bwrap-warm", id="bwrap-warm"),
    pytest.param("process", id="process"),
    pytest.param("docker", id="docker", marks=[pytest.mark.docker, pytest.mark.slow]),
]


def _docker_skip_reason() -> str | None:
    from agentgym.sandbox.docker import docker_available

    if not docker_available():
        return "Docker engine not reachable (start it with scripts/dockerd-start.sh)"
    return None


def make_box(name: str) -> Sandbox:
    if name.startswith("bwrap"):
        from agentgym.sandbox.bwrap import bwrap_available

        if not bwrap_available():
            pytest.skip("bubblewrap missing or cannot create namespaces here")
    if name == "docker":
        reason = _docker_skip_reason()
        if reason:
            pytest.skip(reason)
        return get_sandbox("docker", pool_size=1)
    return get_sandbox(name)


def docker_leftovers() -> list[str]:
    import docker

    c = docker.from_env(timeout=10)
    try:
        return [x.name for x in c.containers.list(all=True, filters={"label": f"{SANDBOX_LABEL}.owner={os.getpid()}"})]
    finally:
        c.close()


@pytest.fixture(scope="module", params=BACKEND_PARAMS)
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    sb = make_box(request.param)
    yield sb
    sb.close()
    if request.param == "docker":
        assert docker_leftovers() == [], "the docker sandbox left containers behind"


@pytest.fixture
def box_factory() -> Iterator[Callable[[str], Sandbox]]:
    """Builds sandboxes by backend name (skipping where one cannot run); closes them afterwards."""
    made: list[Sandbox] = []

    def make(name: str) -> Sandbox:
        b = make_box(name)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()
