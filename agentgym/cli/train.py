"""``agentgym train`` and ``agentgym collect``.

``agentgym train --config configs/train/X.toml [--set optim.lr=1e-5 ...]`` runs the config's recipe
(:mod:`agentgym.recipes`: SFT, or RL for the GRPO family); Ctrl-C finishes the current step and leaves a
resumable checkpoint (rerun the same command to continue). ``--check`` only validates the config.

``agentgym collect --env E --policy expert --out FILE`` writes transcripts for imitation through the
rollout engine; ``--relabel`` labels every state with the env's expert and ``--random-prob P``
makes the expert take a random admissible action with probability P (collection with recoveries);
``--env-kwarg key=value`` passes env constructor kwargs (e.g. ALFWorld's ``obs_style=compact`` or
``expert=planner``), as ``agentgym eval --env-kwarg`` and ``[rollout] env_kwargs`` do.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

__all__ = ["register"]


def _fail(msg: str, code: int = 2) -> NoReturn:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


def train_cmd(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Training config (configs/train/*.toml).")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set optim.lr=1e-5 (repeatable).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Validate the config and exit.")] = False,
    runtime: Annotated[str | None, typer.Option("--runtime", help="Dataflow runtime: embedded (default) or ray "
                                                "(same as --set dataflow.runtime=...).")] = None,
) -> None:
    """Train a policy: GRPO / Dr.GRPO / RLOO on rollouts, or SFT on transcripts."""
    from agentgym.errors import AgentGymError
    from agentgym.trainers.config import load_train_config

    if runtime is not None:
        overrides = [*(overrides or []), f"dataflow.runtime={runtime}"]
    try:
        cfg = load_train_config(config, overrides)
    except AgentGymError as e:
        _fail(str(e))
    if check:
        typer.echo(json.dumps(cfg.to_dict(), indent=2))
        return
    from agentgym.recipes import run_training

    try:
        result = run_training(cfg)
    except AgentGymError as e:
        _fail(str(e), 1)
    if os.environ.get("RANK", "0") != "0":
        return  # one rank of a sharded run (torchrun): rank 0 reports
    from rich.console import Console

    con = Console()
    if "interrupted_at_step" in result:
        con.print(f"interrupted at step {result['interrupted_at_step']}; checkpoint in {cfg.run.out_dir}/checkpoints "
                  "(rerun the same command to resume)")
        raise typer.Exit(130)

    def pct(d: dict[str, Any] | None) -> str:
        if not d or d.get("success") is None:
            return "-"
        iv = d.get("success_interval")
        return (f"{100 * d['success']:.1f}%" + (f" [{100 * iv[0]:.1f}, {100 * iv[1]:.1f}]" if iv else "")
                + f" ({d.get('episodes')} episodes)")

    con.print(f"[bold]done[/]: {result.get('steps')} steps in {result.get('train_wall_s', 0):.0f} s", highlight=False)
    if result.get("before") or result.get("after"):
        kind = (result.get("after") or result.get("before") or {}).get("interval_kind") or ""
        con.print(f"held-out success ({kind}): before {pct(result.get('before'))} -> after "
                  f"{pct(result.get('after'))}", highlight=False)
    con.print(f"run folder: {cfg.run.out_dir} (metrics.jsonl, curves.png, final/, result.json)", highlight=False)


def collect_cmd(
    env: Annotated[str, typer.Option("--env", help="Env id, e.g. agentgym/ALFWorld-v0.")],
    out: Annotated[Path, typer.Option("--out", help="JSONL file to write (a folder gets trajectories.jsonl).")],
    policy: Annotated[str, typer.Option("--policy", help="Acting policy: expert, hf:MODEL, vllm:MODEL, scripted:...")] = "expert",
    split: Annotated[str, typer.Option(help="Task split.")] = "train",
    tasks: Annotated[int | None, typer.Option(help="Tasks (spread evenly over the split); default all.")] = None,
    samples: Annotated[int, typer.Option(help="Episodes per task.")] = 1,
    seed: Annotated[int, typer.Option(help="Env and sampling seed.")] = 0,
    relabel: Annotated[bool, typer.Option("--relabel", help="Label every state with the env's expert (DAgger).")] = False,
    random_prob: Annotated[float, typer.Option("--random-prob", help="Expert actor: random admissible action with this probability.")] = 0.0,
    max_turns: Annotated[int | None, typer.Option(help="Turn limit per episode.")] = None,
    max_tokens: Annotated[int, typer.Option(help="Tokens per turn (model policies).")] = 256,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (model policies).")] = 1.0,
    concurrency: Annotated[int, typer.Option(help="Episodes in flight.")] = 8,
    imports: Annotated[list[str] | None, typer.Option("--import", help="Import a module first (registers custom envs).")] = None,
    env_kwarg: Annotated[list[str] | None, typer.Option("--env-kwarg", help="key=value for the env constructor "
                                                        "(repeatable), as in agentgym eval.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON instead.")] = False,
) -> None:
    """Write transcripts for imitation (SFT) through the rollout engine."""
    import importlib

    from agentgym.cli import _parse_kwargs
    from agentgym.errors import AgentGymError

    for mod in imports or []:
        importlib.import_module(mod)
    try:
        env_kwargs = _parse_kwargs(env_kwarg)
    except typer.BadParameter as e:
        _fail(str(e))
    try:
        summary = asyncio.run(_collect(env, out, policy, split, tasks, samples, seed, relabel, random_prob,
                                       max_turns, max_tokens, temperature, concurrency, env_kwargs))
    except AgentGymError as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    n, sr = summary["episodes"], summary["success_rate"]
    typer.echo(f"wrote {n} episodes of {summary['env']} ({summary['split']} split, {summary['tasks']} tasks x "
               f"{samples}, policy {policy}) to {summary['out']}")
    typer.echo(f"successful: {summary['successes']} of {n}" + (f" ({100 * sr:.1f}%)" if sr is not None else ""))
    if relabel or random_prob:
        typer.echo(f"expert labels: {summary['labelled_states']} states labelled, {summary['relabelled_states']} "
                   f"differ from the action taken; {summary['random_steps']} random steps")
    if summary["errors"]:
        typer.echo(f"warning: {summary['errors']} episodes ended with an error (kept in the file, skipped by SFT)",
                   err=True)
    typer.echo(f"train on them: set [data] paths = [\"{summary['out']}\"] in a config with algorithm = \"sft\"")


async def _collect(env_id: str, out: Path, policy_spec: str, split: str, tasks: int | None, samples: int, seed: int,
                   relabel: bool, random_prob: float, max_turns: int | None, max_tokens: int, temperature: float,
                   concurrency: int, env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    from agentgym.cli.eval import resolve_policy
    from agentgym.errors import ConfigurationError
    from agentgym.eval.runner import select_tasks
    from agentgym.policies.scripted import ExpertPolicy
    from agentgym.policy import SamplingParams, capabilities_of
    from agentgym.registration import env_entry
    from agentgym.rollout import GroupRequest, RolloutEngine, RolloutLimits, RolloutRuntime, micro_batch
    from agentgym.rollout.collect import CollectWorkflow, relabelled_states
    from agentgym.rollout.jsonl import append_jsonl

    env_id = env_entry(env_id).id
    path = out / "trajectories.jsonl" if out.is_dir() or out.suffix == "" else out
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    policy = resolve_policy(policy_spec)
    factory = functools.partial(_make_env, dict(env_kwargs)) if env_kwargs else None
    runtime = RolloutRuntime(max_concurrency=concurrency, env_factory=factory)
    try:
        async with runtime.env(env_id) as env:
            try:
                pool = list(await runtime.call(env.get_wrapper_attr("tasks"), split))
            except AttributeError:
                raise ConfigurationError(f"{env_id} has no tasks(); nothing to collect") from None
        if not pool:
            raise ConfigurationError(f"{env_id} split {split!r} has no tasks")
        chosen = select_tasks(pool, tasks)
        acting = policy
        if not capabilities_of(policy).env_side:
            acting = micro_batch(policy, max_batch=concurrency, runtime=runtime)
        wf = CollectWorkflow(acting, samples, labeler=ExpertPolicy() if relabel else None, random_prob=random_prob,
                             sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens),
                             limits=RolloutLimits(max_turns=max_turns))
        reqs = [GroupRequest(env_id, t.task_id, seed=seed, sampling_seed=seed * 100_003 + i, info={"split": split})
                for i, t in enumerate(chosen)]
        n = succ = random_steps = errors = labelled = differ = 0

        def on_group(_req: GroupRequest, group: Any) -> None:
            nonlocal n, succ, random_steps, errors, labelled, differ
            append_jsonl(path, group.trajectories)
            for t in group.trajectories:
                n += 1
                succ += int(t.success)
                errors += int(t.error is not None)
                random_steps += sum(1 for a in t.info.get("acting", []) if a == "random")
                lab, diff = relabelled_states(t)
                labelled += lab
                differ += diff

        await RolloutEngine(runtime).run(wf, reqs, on_group=on_group)
        _canonical_order(path, [t.task_id for t in chosen])
    finally:
        runtime.close(wait=False)
        await policy.aclose()
    return {"out": str(path), "env": env_id, "split": split, "tasks": len(chosen), "episodes": n, "successes": succ,
            "success_rate": succ / n if n else None, "errors": errors, "random_steps": random_steps,
            "labelled_states": labelled, "relabelled_states": differ, "relabel": relabel, "policy": policy_spec,
            "env_kwargs": dict(env_kwargs or {})}


def _canonical_order(path: Path, task_order: list[str]) -> None:
    """Rewrite ``path`` in task order, then member order. Groups are appended as they finish (a crash keeps what
    was done), so the file's order follows thread timing; SFT shuffles a file's samples by their position, so an
    order that varies between collections would make the same data train a different model."""
    if not path.exists():
        return
    rank = {tid: i for i, tid in enumerate(task_order)}
    lines = [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    keyed = []
    for i, line in enumerate(lines):
        row = json.loads(line)
        keyed.append(((rank.get(row.get("task_id"), len(rank)), row.get("member") or 0, i), line))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for _, line in sorted(keyed)), encoding="utf-8")
    os.replace(tmp, path)


def _make_env(env_kwargs: dict[str, Any], env_id: str) -> Any:
    from agentgym.registration import make

    return make(env_id, **env_kwargs)


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("collect")(collect_cmd)
