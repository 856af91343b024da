"""A two-role example workflow: a solver acts in the env, a verifier reviews each action first.

Protocol of one env step:

1. The solver proposes an action (a solver turn).
2. The verifier sees what happened since its last check plus the proposal and answers
   ``APPROVE`` or ``REJECT: reason`` (a verifier turn).
3. On ``REJECT`` the solver reads the reason and proposes again, once (a second solver turn); that
   retry goes to the env without another review. On ``APPROVE`` the proposal goes to the env.

Every turn carries its role's ``policy_id`` (the two ids must differ) and each policy keeps its own
conversation (and token session), so ``Trajectory.segments()`` gives one training segment per
policy: exactly the ids that policy's model saw.

Rewards per policy (``Trajectory.policy_rewards`` / ``reward_for``):

* solver: the env's reward (sum over steps);
* verifier: the share of its verdicts that agree with the outcome, where APPROVE agrees with a
  successful episode and REJECT with a failed one (0.0 if it gave no verdict).

It runs on the same episode stepper as :class:`~agentgym.rollout.workflow.MultiTurnWorkflow` (a
different routing of turns, not a second loop), so limits, gates, errors and metrics behave the
same. ``limits.max_turns`` counts env steps, not policy turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agentgym.errors import ConfigurationError
from agentgym.policy import Policy, SamplingParams
from agentgym.rollout.episode import Episode, TokenMode, action_of
from agentgym.rollout.gates import Gate, GateRecord
from agentgym.rollout.runtime import RolloutLimits, RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, run_group
from agentgym.types import Message, Trajectory, TrajectoryGroup, messages_text

__all__ = ["VERIFIER_SYSTEM_PROMPT", "SolverVerifierWorkflow", "parse_verdict", "split_by_policy"]

VERIFIER_SYSTEM_PROMPT = (
    "You review the actions of an agent working on a task. Each time, you are shown what happened since "
    "your last review and the agent's proposed next action. If the action is sensible and well-formed, "
    "reply APPROVE. Otherwise reply REJECT: followed by one short sentence saying what is wrong."
)


def parse_verdict(text: str) -> tuple[bool, str]:
    """``(approved, reason)``. REJECT anywhere before any APPROVE rejects; anything else approves."""
    up = text.upper()
    r, a = up.find("REJECT"), up.find("APPROVE")
    if r >= 0 and (a < 0 or r < a):
        reason = text[r + len("REJECT"):].lstrip(" :.-\n").strip()
        return False, reason or "no reason given"
    return True, ""


def split_by_policy(traj: Trajectory) -> dict[str, Trajectory]:
    """One trajectory per policy: that policy's turns only, reward = its policy reward."""
    out: dict[str, Trajectory] = {}
    for pid in traj.policy_ids:
        out[pid] = replace(traj, turns=[t for t in traj.turns if t.policy_id == pid], reward=traj.reward_for(pid),
                           policy_rewards={}, info=dict(traj.info), metrics=dict(traj.metrics),
                           timing=dict(traj.timing), messages=list(traj.messages))
    return out


class SolverVerifierWorkflow:
    """Solver + verifier on one env (see the module docstring).

    Args:
        solver: Acts in the env.
        verifier: Approves or rejects each solver proposal.
        group_size: Episodes per task.
        sampling / verifier_sampling: Sampling per role (the verifier's defaults to 64 tokens).
        limits: ``max_turns`` counts env steps; ``max_total_tokens`` applies to each role's context.
        max_retries: Solver retries after a rejection (1 in the protocol above).
        gates: Early-termination gates over the group (they see the env actions).
    """

    name = "solver_verifier"

    def __init__(self, solver: Policy, verifier: Policy, group_size: int = 1, *,
                 sampling: SamplingParams | None = None, verifier_sampling: SamplingParams | None = None,
                 limits: RolloutLimits | None = None, max_retries: int = 1, token_mode: TokenMode = "auto",
                 verifier_prompt: str = VERIFIER_SYSTEM_PROMPT, gates: Sequence[Gate] = (),
                 gate_log: list[GateRecord] | None = None) -> None:
        if solver.policy_id == verifier.policy_id:
            raise ConfigurationError(
                f"solver and verifier share the policy_id {solver.policy_id!r}; give them distinct ids so "
                "each turn can be attributed to its role (wrap the same model twice with different ids).")
        if group_size < 1 or max_retries < 0:
            raise ConfigurationError("need group_size >= 1 and max_retries >= 0")
        self.solver = solver
        self.verifier = verifier
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self.verifier_sampling = verifier_sampling or SamplingParams(max_tokens=64)
        self.limits = limits or RolloutLimits()
        self.max_retries = max_retries
        self.token_mode: TokenMode = token_mode
        self.verifier_prompt = verifier_prompt
        self.gates = list(gates)
        self.gate_log = gate_log

    @property
    def policies(self) -> list[Policy]:
        return [self.solver, self.verifier]

    async def run(self, runtime: RolloutRuntime, request: GroupRequest) -> TrajectoryGroup:
        return await run_group(runtime, request, self.group_size, self._body, limits=self.limits, gates=self.gates,
                               gate_log=self.gate_log)

    async def _body(self, ep: Episode) -> None:
        traj = ep.traj
        traj.info["roles"] = {"solver": self.solver.policy_id, "verifier": self.verifier.policy_id}
        verdicts: list[bool] = []
        try:
            obs = await ep.reset()
            solver = ep.conversation(self.solver, token_mode=self.token_mode)
            verifier = ep.conversation(self.verifier, tools=None, token_mode=self.token_mode)
            solver.observe(obs)
            verifier.observe([{"role": "system", "content": self.verifier_prompt}])
            since_review: list[Message] = list(obs)
            while ep.next_turn():
                proposal = await ep.propose(solver, self.sampling)
                for _ in range(self.max_retries):  # the last retry goes to the env unreviewed
                    review = "".join(f"[{m['role']}] {m['content']}\n" for m in since_review)
                    verifier.add_user(f"Since your last review:\n{review}\nProposed action:\n{proposal.text}\n\n"
                                      "Reply APPROVE or REJECT: reason.")
                    since_review = []
                    vturn = await ep.propose(verifier, self.verifier_sampling)
                    ok, reason = parse_verdict(vturn.text)
                    verdicts.append(ok)
                    if ok:
                        break
                    feedback: Message = {"role": "user", "content": f"A reviewer rejected that action: {reason} "
                                         "Propose a corrected action."}
                    proposal.observation = [feedback]
                    solver.observe([feedback])
                    traj.messages += [{"role": "assistant", "content": proposal.text}, feedback]
                    proposal = await ep.propose(solver, self.sampling)
                sent = solver.messages[-1]
                out = await ep.act(proposal, action_of(solver))
                if out.done:
                    return
                solver.observe(out.observation)
                since_review += [sent, *out.observation]
                if not await ep.checkpoint():
                    return
        finally:
            agree = [v == traj.success for v in verdicts]
            traj.policy_rewards = {self.verifier.policy_id: sum(agree) / len(agree) if agree else 0.0}
            traj.info["verdicts"] = verdicts
            traj.metrics["rejections"] = sum(1 for v in verdicts if not v)
            if len(ep.conversations) > 1:
                traj.info["verifier_transcript"] = messages_text(ep.conversations[1].messages)
