"""Transcript collection for imitation: plain, or with recoveries and the expert's labels (DAgger-style).

A perfect expert's transcripts contain no mistakes, so a model that imitates them never sees how to
recover from one. :class:`CollectWorkflow` lets *one* policy move the episode and, optionally,
labels every state it passed through with the env's own expert:

* ``policy``: who acts (the env's expert, a model, a scripted policy);
* ``random_prob``: with this probability an env-side actor (the expert) is replaced by a random
  admissible action for one step (the env's ``admissible_actions()``), which puts the episode in
  states the expert alone never reaches;
* ``labeler``: an env-side policy (the expert) asked for its action in every state *before* the
  actor moves; the labels go to ``traj.info["labels"]``, one per assistant message.

Each trajectory also records ``info["tools"]`` (the tool specs the env advertised, which the
student's chat template renders) and ``info["acting"]`` (``"policy"`` or ``"random"`` per step).
The SFT loader (:mod:`agentgym.trainers.sft`) trains on the labels: where a label differs from the
action taken, the taken action stays in the context and the label is trained on as a branch.
"""

from __future__ import annotations

import random
from typing import Any

from agentgym.errors import ConfigurationError
from agentgym.policy import EnvSidePolicy, Policy, SamplingParams, capabilities_of
from agentgym.rollout.episode import Episode, action_of
from agentgym.rollout.runtime import RolloutLimits, RolloutRuntime
from agentgym.rollout.workflow import GroupRequest, run_group
from agentgym.types import Message, Trajectory, TrajectoryGroup

__all__ = ["CollectWorkflow", "label_of", "relabelled_states", "same_action"]


def label_of(action: Any) -> Message:
    """An action (raw text or an assistant message) as an assistant message."""
    if isinstance(action, dict):
        return {"role": "assistant", "content": str(action.get("content") or ""),
                **({"tool_calls": list(action["tool_calls"])} if action.get("tool_calls") else {})}  # type: ignore[typeddict-item]
    return {"role": "assistant", "content": str(action)}


def same_action(a: Message, b: Message) -> bool:
    """Two assistant messages make the same move (same text and tool calls)."""
    return a.get("content", "") == b.get("content", "") and (a.get("tool_calls") or []) == (b.get("tool_calls") or [])


def relabelled_states(traj: Trajectory) -> tuple[int, int]:
    """``(labelled, differing)``: states of a transcript the expert labelled, and those whose label differs
    from the action taken (what the SFT loader trains as branches)."""
    labels = traj.info.get("labels") or []
    taken = [m for m in traj.messages if m["role"] == "assistant"]
    labelled = sum(1 for lb in labels if lb is not None)
    differ = sum(1 for lb, m in zip(labels, taken, strict=False)
                 if lb is not None and not same_action(label_of(lb), label_of(m)))
    return labelled, differ


class CollectWorkflow:
    """Collect transcripts with one acting policy and optional expert labels (see the module docstring).

    Args:
        policy: The acting policy.
        group_size: Episodes per task.
        labeler: An env-side policy whose action for each state becomes that state's label.
        random_prob: Probability of a random admissible action instead of an env-side actor's.
        sampling / limits / token_mode: As in :class:`~agentgym.rollout.MultiTurnWorkflow`.
    """

    name = "collect"

    def __init__(self, policy: Policy, group_size: int = 1, *, labeler: EnvSidePolicy | None = None,
                 random_prob: float = 0.0, sampling: SamplingParams | None = None,
                 limits: RolloutLimits | None = None) -> None:
        if group_size < 1:
            raise ConfigurationError(f"group_size must be >= 1, got {group_size}")
        if not 0.0 <= random_prob <= 1.0:
            raise ConfigurationError(f"random_prob must be in [0, 1], got {random_prob}")
        if labeler is not None and not capabilities_of(labeler).env_side:
            raise ConfigurationError("the labeler must be an env-side policy (the env's expert: ExpertPolicy())")
        if random_prob > 0 and not capabilities_of(policy).env_side:
            raise ConfigurationError("random_prob replaces an env-side actor's moves; a model actor makes its own "
                                     "mistakes (use random_prob=0 with a model policy)")
        self.policy = policy
        self.group_size = group_size
        self.labeler = labeler
        self.random_prob = float(random_prob)
        self.sampling = sampling or SamplingParams()
        self.limits = limits or RolloutLimits()

    @property
    def policies(self) -> list[Policy]:
        return [self.policy]

    async def run(self, runtime: RolloutRuntime, request: GroupRequest) -> TrajectoryGroup:
        return await run_group(runtime, request, self.group_size, self._body, limits=self.limits)

    async def _admissible(self, ep: Episode) -> list[str]:
        try:
            fn = ep.env.get_wrapper_attr("admissible_actions")
        except AttributeError:
            return []
        adm = await ep.runtime.call(fn, timeout=ep.limits.env_timeout_s)
        return [a for a in (adm or []) if isinstance(a, str)]

    async def _body(self, ep: Episode) -> None:
        tr = ep.traj
        seed = f"{ep.spec.seed}|{ep.spec.task_id}|{ep.spec.member}|{ep.spec.sampling_seed}"
        rng = random.Random(seed)
        tr.info["policy_id"] = self.policy.policy_id
        labels: list[Any] = []
        acting: list[str] = []
        try:
            obs = await ep.reset()
            tr.info["tools"] = list(ep.tools or [])
            conv = ep.conversation(self.policy)
            conv.observe(obs)
            while ep.next_turn():
                label = None
                if self.labeler is not None:
                    label = await ep.runtime.call(self.labeler.act, ep.env, timeout=ep.limits.env_timeout_s)
                turn = await ep.propose(conv, self.sampling)
                action = action_of(conv)
                source = "policy"
                if self.random_prob > 0 and rng.random() < self.random_prob:
                    choices = [a for a in await self._admissible(ep) if a != turn.text]
                    if choices:
                        action = rng.choice(choices)
                        turn.text = action
                        source = "random"
                if self.labeler is not None:
                    labels.append(label)
                acting.append(source)
                out = await ep.act(turn, action)
                if out.done:
                    return
                conv.observe(out.observation)
        finally:
            tr.info["acting"] = acting
            if self.labeler is not None:
                tr.info["labels"] = labels
