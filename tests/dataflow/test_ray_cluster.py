"""A real two-node Ray cluster on 127.0.0.1: placement on the second node, elastic scaling, actor kills."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dataflow_fakes import configs, held_tickets
from test_runtimes import TASKS, resubmitted_once_elsewhere, spec, trainer

from agentgym.dataflow.tasks import TaskStream

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """``ray start`` twice: a head and a second node (custom resource ``node2``), both on 127.0.0.1."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    path = os.pathsep.join([str(TESTS / "dataflow"), str(TESTS / "rollout"), os.environ.get("PYTHONPATH", "")])
    # Ray 2.59+ turns token authentication on for `ray start --head` by default, while a driver that
    # imported ray earlier in this process keeps its mode: run this loopback-only cluster without it
    # (a real deployment should set RAY_AUTH_MODE=token and one RAY_AUTH_TOKEN on every node and driver)
    auth = {"RAY_AUTH_MODE": "disabled"}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    env = {**os.environ, "PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                    "--resources=" + json.dumps({"head": 1}), *common], env=env, check=True, capture_output=True,
                   timeout=180)
    try:
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{port}", "--num-cpus=1",
                        "--resources=" + json.dumps({"node2": 1}), *common], env=env, check=True, capture_output=True,
                       timeout=180)
        address = f"127.0.0.1:{port}"
        ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
        deadline = time.monotonic() + 60
        while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        yield address
    finally:
        ray.shutdown()
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _runtime(address: str, **cfg: object):  # type: ignore[no-untyped-def]
    from agentgym.dataflow.ray_runtime import RayRuntime

    return RayRuntime(TaskStream(TASKS), *configs(**{"poll_s": 0.05, **cfg}), address=address)


async def test_service_runs_on_the_second_node(cluster: str) -> None:
    import ray

    rt = _runtime(cluster, groups_per_step=2, max_staleness=0)
    await rt.start()
    try:
        s1 = spec("on-head")
        s1.resources = {"head": 0.01}
        await rt.add_service(s1)
        s2 = spec("on-node2")
        s2.resources = {"node2": 0.01}
        await rt.add_service(s2)
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        head_node = (await rt.service_status("on-head"))["node_id"]
        second = (await rt.service_status("on-node2"))["node_id"]
        assert head_node != second and "node2" in nodes[second] and "head" in nodes[head_node]
        staleness, _ = await trainer(rt, 2)
        stats = await rt.stats()
        await rt.drain(timeout=60)
        await rt.check_ledger(drained=True)
    finally:
        await rt.stop()
    assert staleness == [0] * 4
    assert all(stats["services"][s]["completed"] > 0 for s in ("on-head", "on-node2"))


async def test_an_added_service_takes_work_and_killing_it_loses_nothing(cluster: str, tmp_path: Path) -> None:
    """Elastic scaling on a real two-node cluster: the mechanism only (the service added on node2 receives and
    finishes work; killed mid-episode, its tickets finish once elsewhere). The throughput gain of adding
    services is a figure, measured in ``benchmarks/bench_dataflow.py --sections elastic``."""
    rt = _runtime(cluster, groups_per_step=4, max_staleness=8, dead_after_s=120)
    await rt.start()
    try:
        s1 = spec("s1", latency=0.15)
        s1.capacity = 2
        await rt.add_service(s1)
        _, t_one = await trainer(rt, 2)
        hold = tmp_path / "hold"
        s2 = spec("s2", latency=0.15, hold=str(hold))
        s2.capacity, s2.resources = 2, {"node2": 0.01}
        await rt.add_service(s2)
        _, t_two = await trainer(rt, 3)
        deadline = time.monotonic() + 120
        while (await rt.stats())["services"]["s2"]["completed"] == 0:  # the added service finishes work
            assert time.monotonic() < deadline, "the added service finished no work in 120 s"
            await asyncio.sleep(0.05)
        hold.touch()  # from now on s2 keeps what it works on
        later = asyncio.ensure_future(trainer(rt, 2))  # consuming frees budget, so new work is dispatched
        held = await held_tickets(hold)  # mid-episode: s2 holds groups that cannot finish there
        await rt.kill_service("s2")
        _, t_after = await later
        await rt.drain(timeout=120)
        counts = await rt.check_ledger(drained=True)
        records = await rt.tickets(held)
        live = await rt.live_services()
    finally:
        await rt.stop()
    assert live == ["s1"] and held and counts["resubmitted"] >= resubmitted_once_elsewhere(records, "s2", "s1") >= 1
    trained = t_one + t_two + t_after
    assert len(trained) == len(set(trained)) == counts["states"]["trained"]
