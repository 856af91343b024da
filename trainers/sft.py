"""Behaviour-cloning samples from transcripts, tokenized with the student's own chat template.

Transcripts (``agentgym collect``) are plain trajectories whose assistant messages are the actions
taken. They carry no token ids (an env-side expert generates text), so they are rendered here
with the model's template exactly as a token-in/token-out rollout would see them: the first prompt,
then each assistant completion (the loss mask is 1 on its tokens up to and including the end-of-turn
token), then the observation glue (mask 0), and so on. Only the assistant's tokens are trained.

**Relabelled transcripts** (DAgger-style collection with recoveries) also carry
``info["labels"]``: one entry per assistant message, the expert's action *for the state in which
the acting policy moved*. Where the label equals the action taken, the episode's sequence trains on
it directly. Where it differs, the action taken stays in the context with mask 0 (the episode
continues from it) and a branch sample ``context + label`` trains the label: the model learns what
the expert does *after* a mistake, which a perfect expert's transcripts never show.

``info["tools"]`` (the tool specs the env advertised) is passed to the template, as in a rollout.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigurationError, TrainingDataError
from agentgym.rollout.collect import label_of, relabelled_states, same_action
from agentgym.types import Message, Trajectory

from .batching import TrainSample

__all__ = ["load_transcripts", "sft_samples", "transcript_samples"]


class _Renderer:
    def __init__(self, tokenizer: Any, tools: list[Any] | None) -> None:
        self.tok = tokenizer
        self.tools = tools or None
        eos = tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])

    def render(self, messages: Sequence[Message], gen: bool) -> str:
        return str(self.tok.apply_chat_template(list(messages), tools=self.tools, tokenize=False,
                                                add_generation_prompt=gen))

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"]) if text else []

    def target(self, text: str) -> tuple[list[int], list[int]]:
        """Completion ids and mask: 1 up to and including the first end-of-turn token, 0 after (glue)."""
        ids = self.encode(text)
        cut = next((i + 1 for i, t in enumerate(ids) if t in self.eos), len(ids))
        return ids, [1] * cut + [0] * (len(ids) - cut)


def transcript_samples(traj: Trajectory, tokenizer: Any, policy_id: str = "policy") -> list[TrainSample]:
    """SFT samples of one transcript (see the module docstring).

    Raises:
        TrainingDataError: the template does not render the conversation as a growing prefix, or
            ``info["labels"]`` does not match the assistant messages.
    """
    msgs = list(traj.messages)
    r = _Renderer(tokenizer, traj.info.get("tools"))
    asst = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    labels = traj.info.get("labels")
    if labels is not None and len(labels) != len(asst):
        raise TrainingDataError(f"{traj.task_id}: {len(labels)} labels for {len(asst)} assistant messages")
    ids: list[int] = []
    mask: list[int] = []
    text = ""
    out: list[TrainSample] = []
    for j, k in enumerate(asst):
        prefix = r.render(msgs[:k], gen=True)
        if not prefix.startswith(text):
            raise TrainingDataError(f"{traj.task_id}: the chat template does not render turn {j} as a continuation "
                                    "of the previous turns; token-exact SFT needs a prefix-stable template")
        glue = r.encode(prefix[len(text):])
        ids += glue
        mask += [0] * len(glue)
        taken = label_of(msgs[k])
        label = label_of(labels[j]) if labels is not None and labels[j] is not None else taken
        full = r.render([*msgs[:k], label], gen=False)
        if not full.startswith(prefix):
            raise TrainingDataError(f"{traj.task_id}: the template's assistant turn {j} does not extend its prompt")
        lids, lmask = r.target(full[len(prefix):])
        if same_action(label, taken):
            ids += lids
            mask += lmask
            text = full
            continue
        out.append(TrainSample(policy_id, ids + lids, [0] * len(ids) + lmask, 1.0, None, [], traj.reward, traj.group_id))
        acted = r.render(msgs[: k + 1], gen=False)
        tids = r.encode(acted[len(prefix):])
        ids += tids
        mask += [0] * len(tids)
        text = acted
    if any(mask):
        out.insert(0, TrainSample(policy_id, ids, mask, 1.0, None, [], traj.reward, traj.group_id))
    return out


def sft_samples(trajectories: Iterable[Trajectory], tokenizer: Any, policy_id: str = "policy", *,
                only_success: bool = False, max_len: int | None = None) -> tuple[list[TrainSample], dict[str, int]]:
    """SFT samples from many transcripts; returns ``(samples, counts)`` (kept/skipped, and why)."""
    counts = {"episodes": 0, "used_episodes": 0, "failed_skipped": 0, "error_skipped": 0, "samples": 0,
              "relabelled_turns": 0, "too_long_skipped": 0, "trained_tokens": 0}
    out: list[TrainSample] = []
    for t in trajectories:
        counts["episodes"] += 1
        if t.error is not None:
            counts["error_skipped"] += 1
            continue
        if only_success and not t.success:
            counts["failed_skipped"] += 1
            continue
        samples = transcript_samples(t, tokenizer, policy_id)
        counts["used_episodes"] += 1
        for s in samples:
            if max_len is not None and len(s) > max_len:
                counts["too_long_skipped"] += 1
                continue
            out.append(s)
        counts["relabelled_turns"] += relabelled_states(t)[1]
    counts["samples"] = len(out)
    counts["trained_tokens"] = sum(s.num_masked for s in out)
    return out, counts


def load_transcripts(paths: Sequence[str]) -> list[Trajectory]:
    """Trajectories from JSONL files (or folders holding ``trajectories.jsonl``), for ``[data] paths``."""
    from agentgym.rollout.jsonl import iter_jsonl

    out: list[Trajectory] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            path = path / "trajectories.jsonl"
        if not path.is_file():
            raise ConfigurationError(f"data.paths: {p} does not exist (write it with agentgym collect --out {p})")
        out += list(iter_jsonl(path))
    if not out:
        raise ConfigurationError(f"data.paths {list(paths)} hold no trajectories")
    return out
