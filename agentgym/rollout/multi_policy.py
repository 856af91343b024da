"""A two-role example workflow: a solver acts in the env, a verifier reviews each action first.

Protocol of one env step:

1. The solver proposes an action (a solver turn).
2. The verifier sees what happened since its last check plus the proposal and answers
   ``APPROVE`` or ``REJECT: reason`` (a verifier turn).
3. On ``REJECT`` the solver reads the reason and proposes again, once (a second solver turn); that
   retry goes to the env without another review. On ``APPROVE`` the proposal goes to the env.

Every turn carries its role's ``policy_id`` (the two ids must differ), each policy keeps its own
conversation (and token session), so :func:`split_by_policy` yields one trainable trajectory per
role whose token deltas chain correctly.

Rewards per role (``info["role_rewards"]``):

* solver: the env's reward (sum over steps);
* verifier: the share of its verdicts that agree with the outcome, where APPROVE agrees with a
  successful episode and REJECT with a failed one (0.0 if it gave no verdict).

This workflow is an example of the pattern; it takes no gates (use :class:`MultiTurnWorkflow` for
gated GRPO groups). ``limits.max_turns`` counts env steps here, not policy turns.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any

import gymnasium

from agentgym.errors import ConfigurationError
from agentgym.policy import Policy, SamplingParams
from agentgym.rollout.episode import Conversation, EpisodeSpec, TokenMode, TruncatedEpisode, env_tool_specs
from agentgym.rollout.gates import canonical_action
from agentgym.rollout.runtime import RolloutLimits, RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, error_trajectory, member_sampling_seed
from agentgym.types import Message, Trajectory, Turn, messages_text

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
    """One trajectory per policy: that policy's turns only, reward = its role reward."""
    out: dict[str, Trajectory] = {}
    roles: dict[str, str] = traj.info.get("roles", {})
    by_pid = {pid: role for role, pid in roles.items()}
    role_rewards: dict[str, float] = traj.info.get("role_rewards", {})
    for pid in dict.fromkeys(t.policy_id for t in traj.turns):
        role = by_pid.get(pid, pid)
        out[pid] = replace(traj, turns=[t for t in traj.turns if t.policy_id == pid],
                           reward=float(role_rewards.get(role, traj.reward)),
                           info={**traj.info, "role": role}, metrics=dict(traj.metrics), timing=dict(traj.timing),
                           messages=list(traj.messages))
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
    """

    name = "solver_verifier"

    def __init__(self, solver: Policy, verifier: Policy, group_size: int = 1, *,
                 sampling: SamplingParams | None = None, verifier_sampling: SamplingParams | None = None,
                 limits: RolloutLimits | None = None, max_retries: int = 1, token_mode: TokenMode = "auto",
                 verifier_prompt: str = VERIFIER_SYSTEM_PROMPT) -> None:
        if solver.policy_id == verifier.policy_id:
            raise ConfigurationError(
                f"solver and verifier share the policy_id {solver.policy_id!r}; give them distinct ids so "
                "each turn can be attributed to its role (wrap the same model twice with different ids).")
        self.solver = solver
        self.verifier = verifier
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self.verifier_sampling = verifier_sampling or SamplingParams(max_tokens=64)
        self.limits = limits or RolloutLimits()
        self.max_retries = max_retries
        self.token_mode: TokenMode = token_mode
        self.verifier_prompt = verifier_prompt

    async def run(self, runtime: RolloutRuntime, request: GroupRequest) -> list[Trajectory]:
        group_id = request.group_id or uuid.uuid4().hex[:12]

        async def member(i: int) -> Trajectory:
            spec = EpisodeSpec(request.env_id, request.task_id, request.seed, group_id, i,
                               member_sampling_seed(request.sampling_seed, i), dict(request.info))
            async with runtime.slot():
                try:
                    async with runtime.env(request.env_id, timeout=self.limits.env_timeout_s) as env:
                        traj = await self._episode(runtime, env, spec)
                        if traj.error is not None and traj.info.get("error_source") == "env":
                            runtime.discard(env)
                        return traj
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    return error_trajectory(request, group_id, i, e)

        return list(await asyncio.gather(*(member(i) for i in range(self.group_size))))

    async def _episode(self, runtime: RolloutRuntime, env: gymnasium.Env[Any, Any], spec: EpisodeSpec) -> Trajectory:
        lim = self.limits
        t0 = time.monotonic()
        deadline = t0 + lim.max_wall_s if lim.max_wall_s else None
        traj = Trajectory(task_id=spec.task_id, env_id=spec.env_id, group_id=spec.group_id,
                          info={**spec.info, "member": spec.member, "seed": spec.seed,
                                "roles": {"solver": self.solver.policy_id, "verifier": self.verifier.policy_id}})
        verdicts: list[bool] = []
        actions: list[str] = []
        success = False
        stage = "env"
        solver_conv: Conversation | None = None
        verifier_conv: Conversation | None = None
        try:
            obs, info = await runtime.call(env.reset, seed=spec.seed, options={"task_id": spec.task_id},
                                           timeout=lim.env_timeout_s)
            traj.info["task_type"] = info.get("task_type", "default")
            inner = env.unwrapped
            tools = env_tool_specs(env)
            oracle = getattr(inner, "expert_action", None)
            solver_conv = Conversation(self.solver, tools, self.token_mode)
            verifier_conv = Conversation(self.verifier, None, self.token_mode)
            solver_conv.observe(list(obs))
            verifier_conv.observe([{"role": "system", "content": self.verifier_prompt}])
            since_review: list[Message] = list(obs)
            traj.messages = list(obs)
            n_turn = 0

            async def call(conv: Conversation, sampling: SamplingParams, use_oracle: bool) -> Turn:
                nonlocal n_turn
                if deadline is not None and time.monotonic() >= deadline:
                    raise TruncatedEpisode("max_wall_s")
                timeout = lim.policy_timeout_s if deadline is None else max(0.0, min(lim.policy_timeout_s,
                                                                                   deadline - time.monotonic()))
                s = sampling if spec.sampling_seed is None else replace(
                    sampling, seed=(spec.sampling_seed * 1_000_003 + n_turn) % (2**31 - 1))
                n_turn += 1
                gen, prompt_ids = await conv.generate(s, oracle=oracle if use_oracle else None, timeout=timeout,
                                                      max_context=lim.max_total_tokens)
                turn = Turn(policy_id=conv.policy.policy_id, prompt_token_ids=prompt_ids,
                            completion_token_ids=list(gen.token_ids), completion_logprobs=list(gen.logprobs),
                            weight_version=gen.weight_version, text=gen.text, finish_reason=gen.finish_reason)
                traj.turns.append(turn)
                return turn

            steps = 0
            while True:
                if lim.max_turns is not None and steps >= lim.max_turns:
                    raise TruncatedEpisode("max_turns")
                stage = "policy"
                proposal = await call(solver_conv, self.sampling, True)
                for attempt in range(self.max_retries + 1):
                    if attempt == self.max_retries:
                        break  # the last retry goes to the env unreviewed
                    review = "".join(f"[{m['role']}] {m['content']}\n" for m in since_review)
                    verifier_conv.add_user(
                        f"Since your last review:\n{review}\nProposed action:\n{proposal.text}\n\n"
                        "Reply APPROVE or REJECT: reason.")
                    since_review = []
                    vturn = await call(verifier_conv, self.verifier_sampling, False)
                    ok, reason = parse_verdict(vturn.text)
                    verdicts.append(ok)
                    if ok:
                        break
                    feedback: Message = {"role": "user", "content": f"A reviewer rejected that action: {reason} "
                                         "Propose a corrected action."}
                    proposal.observation = [feedback]
                    solver_conv.observe([feedback])
                    traj.messages += [{"role": "assistant", "content": proposal.text}, feedback]
                    proposal = await call(solver_conv, self.sampling, True)
                stage = "env"
                action = solver_conv.messages[-1]
                traj.messages.append(action)
                obs, reward, terminated, truncated, info = await runtime.call(env.step, dict(action),
                                                                              timeout=lim.env_timeout_s)
                steps += 1
                obs = list(obs)
                proposal.observation = obs
                proposal.tool_calls = list(info.get("tool_calls") or [])
                proposal.reward = float(reward)
                traj.reward += float(reward)
                traj.messages += obs
                actions.append(canonical_action(proposal.tool_calls, None, proposal.text))
                if terminated:
                    traj.terminated = True
                    success = bool(info.get("success", False))
                    break
                if truncated:
                    traj.truncated = True
                    traj.info["truncated_reason"] = "env_limit"
                    break
                stage = "rollout"
                solver_conv.observe(obs)
                since_review += [action, *obs]
        except TruncatedEpisode as e:
            traj.truncated = True
            traj.info["truncated_reason"] = e.reason
        except asyncio.CancelledError:
            raise
        except Exception as e:
            traj.error = f"{type(e).__name__}: {e}"
            traj.info["error_kind"] = type(e).__name__
            traj.info["error_source"] = stage
        traj.success = success
        agree = [v == success for v in verdicts]
        traj.info["role_rewards"] = {"solver": traj.reward,
                                     "verifier": sum(agree) / len(agree) if agree else 0.0}
        traj.info["verdicts"] = verdicts
        traj.info["actions"] = actions
        if verifier_conv is not None:
            traj.info["verifier_transcript"] = messages_text(verifier_conv.messages)
        traj.metrics = {"turns": len(traj.turns), "env_steps": len(actions),
                        "generated_tokens": traj.num_generated_tokens,
                        "prompt_tokens": sum(len(t.prompt_token_ids) for t in traj.turns),
                        "rejections": sum(1 for v in verdicts if not v)}
        traj.timing = {"wall_s": time.monotonic() - t0}
        return traj
