"""The Ray runtime: DataFlow and every RolloutService are Ray actors; the trainer drives from the driver.

* ``ServiceActor`` builds a :class:`~agentgym.dataflow.service.RolloutService` from its
  :class:`~agentgym.dataflow.spec.ServiceSpec` *inside* the actor (so its policies and envs live
  on the actor's node) and exposes the service API as async actor methods. Weight updates reach it
  signed (:func:`agentgym.weights.encode`, the runtime's key) and are verified before a policy sees them.
* :class:`RayService` is the :class:`~agentgym.dataflow.service.ServiceHandle` over such an actor:
  a dead actor (killed, crashed, node lost) or a call past ``call_timeout_s`` raises
  :class:`~agentgym.dataflow.service.ServiceDead`, and DataFlow resubmits the service's work.
* The flow is :class:`~agentgym.dataflow.host.FlowHost` (the same wrapper the embedded runtime calls)
  in an async actor.
* :class:`RayRuntime` is the driver-side API, the same as
  :class:`~agentgym.dataflow.runtime.EmbeddedRuntime`'s.

Multi-node: start a head (``ray start --head``) and more nodes (``ray start --address=HEAD``), give
nodes custom resources (``--resources '{"node2": 1}'``) and place a service with
``ServiceSpec(resources={"node2": 0.01})``; connect with ``RayRuntime(..., address="HEAD:PORT")``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.dataflow.config import DataflowConfig, FlowParams
from agentgym.dataflow.flow import Batch
from agentgym.dataflow.host import FlowHost
from agentgym.dataflow.ledger import Ticket
from agentgym.dataflow.service import ServiceDead, ServiceResult
from agentgym.dataflow.spec import ServiceSpec, build_service
from agentgym.dataflow.tasks import TaskStream
from agentgym.errors import ConfigurationError, DependencyNotInstalled, WeightUpdateRejected
from agentgym.weights import KEY_ENV, Publication, WeightUpdate, encode, shared_key

__all__ = ["RayRuntime", "RayService"]


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise DependencyNotInstalled("the Ray runtime", "agentgym[ray]") from e
    return ray


def _cause(e: Exception) -> Exception:
    """The exception a remote method raised (its own class and message), from Ray's wrapper."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, Exception) else e


class _ServiceActor:
    """A RolloutService inside a Ray actor (decorated with ``ray.remote`` in :func:`_actor_classes`)."""

    def __init__(self, spec: ServiceSpec, weights_key: bytes) -> None:
        import os

        os.environ[KEY_ENV] = weights_key.decode()  # for what the service builds here (a vLLM engine's workers)
        self.spec = spec
        self.svc = build_service(spec, weights_key=weights_key)

    async def submit(self, ticket: Ticket) -> None:
        await self.svc.submit(ticket)

    async def collect(self, timeout: float = 0.0) -> list[ServiceResult]:
        return await self.svc.collect(timeout)

    async def status(self) -> dict[str, Any]:
        import ray

        return {**await self.svc.status(), "node_id": ray.get_runtime_context().get_node_id()}

    async def update_weights(self, policy_id: str, payload: bytes, version: int) -> list[str]:
        if not isinstance(payload, bytes):  # across the process boundary only signed payloads are taken
            raise WeightUpdateRejected("a service actor takes weight updates as signed payloads only")
        return await self.svc.update_weights(policy_id, payload, version)

    async def weight_version(self, policy_id: str) -> int:
        return await self.svc.weight_version(policy_id)

    async def weight_checksums(self, policy_id: str, names: list[str]) -> dict[str, int]:
        return await self.svc.weight_checksums(policy_id, names)

    async def cancel(self, ticket_id: str, attempt: int) -> bool:
        return await self.svc.cancel(ticket_id, attempt)

    async def stop(self) -> None:
        await self.svc.stop()


class RayService:
    """A :class:`~agentgym.dataflow.service.ServiceHandle` over a service actor (see the module docstring)."""

    def __init__(self, actor: Any, service_id: str, weights_key: bytes, call_timeout_s: float = 300.0) -> None:
        self.actor = actor
        self.service_id = service_id
        self.weights_key = weights_key
        self.call_timeout_s = call_timeout_s

    async def _call(self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        ray = _ray()
        try:
            ref = getattr(self.actor, method).remote(*args, **kwargs)
            return await asyncio.wait_for(ref, timeout or self.call_timeout_s)
        except asyncio.TimeoutError:
            raise ServiceDead(f"service {self.service_id}: {method} got no answer in "
                              f"{timeout or self.call_timeout_s:g} s") from None
        except ray.exceptions.RayActorError as e:  # killed, crashed, or its node is gone
            raise ServiceDead(f"service {self.service_id} actor is dead: {type(e).__name__}") from None
        except ray.exceptions.RayTaskError as e:  # the method raised: re-raise the original error
            raise _cause(e) from None

    async def submit(self, ticket: Ticket) -> None:
        await self._call("submit", ticket)

    async def collect(self, timeout: float = 0.0) -> list[ServiceResult]:
        out: list[ServiceResult] = await self._call("collect", timeout, timeout=timeout + self.call_timeout_s)
        return out

    async def status(self) -> dict[str, Any]:
        out: dict[str, Any] = await self._call("status")
        return out

    async def update_weights(self, policy_id: str, update: WeightUpdate | bytes, version: int) -> list[str]:
        """Sent signed (:func:`agentgym.weights.encode`): the actor verifies it before any policy sees it."""
        payload = encode(update, version, self.weights_key) if isinstance(update, WeightUpdate) else bytes(update)
        out: list[str] = await self._call("update_weights", policy_id, payload, version)
        return out

    async def weight_version(self, policy_id: str) -> int:
        return int(await self._call("weight_version", policy_id))

    async def weight_checksums(self, policy_id: str, names: list[str]) -> dict[str, int]:
        out: dict[str, int] = await self._call("weight_checksums", policy_id, names)
        return out

    async def cancel(self, ticket_id: str, attempt: int) -> bool:
        return bool(await self._call("cancel", ticket_id, attempt))

    async def stop(self) -> None:
        with contextlib.suppress(ServiceDead):
            await self._call("stop", timeout=30)
        _ray().kill(self.actor, no_restart=True)


_CLASSES: dict[str, Any] = {}


def _actor_classes() -> tuple[Any, Any]:
    if not _CLASSES:
        ray = _ray()
        _CLASSES["service"] = ray.remote(num_cpus=0, max_restarts=0)(_ServiceActor)
        _CLASSES["flow"] = ray.remote(num_cpus=0, max_restarts=0)(FlowHost)
    return _CLASSES["service"], _CLASSES["flow"]


class RayRuntime:
    """The flow and its services as Ray actors (see the module docstring).

    Args:
        stream / config / params: As for :class:`~agentgym.dataflow.runtime.EmbeddedRuntime` (the stream is
            shipped to the flow actor).
        address: A running cluster (``"127.0.0.1:6379"``); ``None`` starts (or joins) a local Ray.
        init_kwargs: Extra ``ray.init`` arguments (``runtime_env``, ``num_cpus``...).
        weights_key: Signs weight updates to the service actors (default: ``AGENTGYM_WEIGHTS_KEY``, or
            a new key for this run). Ray's own transport is pickle, so anyone who can call an actor can
            run code in it: secure the cluster itself (Ray's token auth); the HMAC makes the services
            take weights only from this runtime's publisher.
    """

    name = "ray"

    def __init__(self, stream: TaskStream, config: DataflowConfig | None = None, params: FlowParams | None = None, *,
                 address: str | None = None, init_kwargs: dict[str, Any] | None = None,
                 weights_key: bytes | None = None) -> None:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_kwargs or {}))
        self._service_cls, flow_cls = _actor_classes()
        self.config = config or DataflowConfig()
        key = weights_key or shared_key(create=True)
        assert key is not None
        self._weights_key: bytes = key
        self.flow = flow_cls.remote(stream, self.config, params or FlowParams())
        self.actors: dict[str, Any] = {}

    async def start(self) -> None:
        await self.flow.start.remote()

    async def add_service(self, spec: ServiceSpec, *, weights: Mapping[str, tuple[WeightUpdate, int]] | None = None) -> None:
        if spec.name in self.actors:
            raise ConfigurationError(f"a service is already named {spec.name!r}")
        opts: dict[str, Any] = {"resources": dict(spec.resources)} if spec.resources else {}
        actor = self._service_cls.options(**opts).remote(spec, self._weights_key)
        await actor.status.remote()  # built (policies loaded) before it joins
        self.actors[spec.name] = actor
        if weights:
            for pid, (state, version) in weights.items():
                await actor.update_weights.remote(pid, encode(state, version, self._weights_key), version)
        await self.flow.add_service.remote(RayService(actor, spec.name, self._weights_key), spec.capacity, True)

    async def remove_service(self, name: str, *, drain: bool = True) -> None:
        await self.flow.remove_service.remote(name, drain)

    async def kill_service(self, name: str) -> None:
        """Kill the service's actor (no restart): its in-flight work is resubmitted elsewhere."""
        _ray().kill(self.actors[name], no_restart=True)

    async def service_status(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = await self.actors[name].status.remote()
        return out

    async def get_batch(self, policy_id: str, n_groups: int | None = None, timeout: float | None = None) -> Batch:
        try:
            out: Batch = await self.flow.get_batch.remote(policy_id, n_groups, timeout)
        except _ray().exceptions.RayTaskError as e:
            raise _cause(e) from None
        return out

    async def publish(self, policy_id: str, publication: Publication) -> dict[str, str]:
        try:
            out: dict[str, str] = await self.flow.publish.remote(policy_id, publication)
        except _ray().exceptions.RayTaskError as e:
            raise _cause(e) from None
        return out

    async def step_done(self, policy_id: str) -> None:
        await self.flow.step_done.remote(policy_id)

    async def live_services(self) -> list[str]:
        out: list[str] = await self.flow.live_services.remote()
        return out

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = await self.flow.stats.remote()
        return out

    async def drain(self, timeout: float | None = None) -> None:
        await self.flow.drain.remote(timeout)

    async def check_ledger(self, drained: bool = False) -> dict[str, Any]:
        try:
            out: dict[str, Any] = await self.flow.check_ledger.remote(drained)
        except _ray().exceptions.RayTaskError as e:
            raise _cause(e) from None
        return out

    async def tickets(self, ticket_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = await self.flow.tickets.remote(list(ticket_ids))
        return out

    async def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = await self.flow.state_dict.remote()
        return out

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        await self.flow.load_state_dict.remote(state)

    async def stop(self) -> None:
        ray = _ray()
        with contextlib.suppress(Exception):  # the flow actor may already be gone
            await asyncio.wait_for(self.flow.stop.remote(), 60)
        for actor in [self.flow, *self.actors.values()]:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
