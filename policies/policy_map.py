"""``PolicyMap``: role -> policy, for multi-policy workflows (solver + verifier, planner + executor)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.errors import ConfigurationError
from agentgym.policy import Capabilities, Generation, GenRequest, Policy, PolicyLifecycle, describe_policy

__all__ = ["PolicyMap"]


class PolicyMap(PolicyLifecycle):
    """Maps roles to policies. Itself a Policy that routes each request by ``metadata["role"]``.

    Args:
        policies: role -> policy. One policy may serve several roles.
        default: Role used for requests without ``metadata["role"]`` (default: the only role, if one).
        policy_id: Id of the map itself (turns keep the id of the policy that generated them).

    Example::

        pm = PolicyMap({"solver": HFPolicy(...), "verifier": ExpertPolicy()})
        gens = await pm["solver"].generate([...])          # direct
        gens = await pm.generate([GenRequest(..., metadata={"role": "verifier"})])  # routed
    """

    def __init__(self, policies: Mapping[str, Policy], default: str | None = None, policy_id: str = "policy_map") -> None:
        if not policies:
            raise ConfigurationError("PolicyMap needs at least one role")
        for role, pol in policies.items():
            if not isinstance(pol, Policy):
                raise ConfigurationError(f"role {role!r}: {type(pol).__name__} is not a Policy (needs policy_id and async generate)")
        if default is None and len(policies) == 1:
            default = next(iter(policies))
        if default is not None and default not in policies:
            raise ConfigurationError(f"default role {default!r} is not one of {sorted(policies)}")
        self._policies = dict(policies)
        self.default = default
        self.policy_id = policy_id

    @classmethod
    def from_specs(cls, specs: Mapping[str, str], default: str | None = None, **kwargs: Any) -> PolicyMap:
        """Build from role -> spec strings (see :func:`agentgym.policies.from_spec`); equal specs share one policy."""
        from .spec import from_spec

        built: dict[str, Policy] = {}
        out: dict[str, Policy] = {}
        for role, spec in specs.items():
            if spec not in built:
                built[spec] = from_spec(spec, **kwargs)
            out[role] = built[spec]
        return cls(out, default=default)

    capabilities = Capabilities()  # a router: use the role's own policy for sessions and weights

    async def aclose(self) -> None:
        """Close every distinct policy once."""
        seen: set[int] = set()
        for pol in self._policies.values():
            if id(pol) not in seen:
                seen.add(id(pol))
                await pol.aclose()

    def describe(self) -> dict[str, Any]:
        return describe_policy(self, backend="policy map", roles={r: p.describe() for r, p in self._policies.items()})

    @property
    def roles(self) -> list[str]:
        """The roles, in insertion order."""
        return list(self._policies)

    def __getitem__(self, role: str) -> Policy:
        try:
            return self._policies[role]
        except KeyError:
            raise ConfigurationError(f"no policy for role {role!r}; roles: {', '.join(self._policies)}") from None

    def __contains__(self, role: object) -> bool:
        return role in self._policies

    def __len__(self) -> int:
        return len(self._policies)

    def items(self) -> list[tuple[str, Policy]]:
        """(role, policy) pairs."""
        return list(self._policies.items())

    def role_of(self, req: GenRequest) -> str:
        """The role a request is routed to."""
        role = req.metadata.get("role", self.default)
        if role is None:
            raise ConfigurationError(f"request has no metadata['role'] and the map has no default; roles: {', '.join(self._policies)}")
        return str(role)

    async def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        """Route each request to its role's policy (one batched call per policy); keeps the order."""
        import asyncio

        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            role = self.role_of(req)
            self[role]  # validate early
            groups.setdefault(role, []).append(i)
        roles = list(groups)
        outs = await asyncio.gather(*(self[r].generate([requests[i] for i in groups[r]]) for r in roles))
        per_request: dict[int, list[Generation]] = {}
        for role, gens in zip(roles, outs, strict=True):
            pos = 0
            for i in groups[role]:
                n = requests[i].n
                per_request[i] = list(gens[pos : pos + n])
                pos += n
            if pos != len(gens):
                raise ConfigurationError(f"policy for role {role!r} returned {len(gens)} generations, expected {pos}")
        return [g for i in range(len(requests)) for g in per_request[i]]
