"""``agentgym eval`` and ``agentgym report``.

``agentgym eval --env ID[,ID...] --policy SPEC --split test --tasks N --samples K --seeds 0,1,2
--max-turns T --out DIR`` evaluates a policy with a recorded protocol (see
:mod:`agentgym.eval.runner`); rerunning the same command resumes. ``agentgym report DIR... --out R``
compares runs. Heavy imports happen inside the commands.

Exit status of ``eval``: 0 when the run finished (some episodes may have failed: a warning says
how many), 1 when *every* episode failed (an error, or no answer from the policy in time: the
message shows the first error), 2 for bad arguments, 3 when ``--deadline`` stopped the run
(rerun to resume), 130 on Ctrl-C.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from agentgym.policy import Policy

__all__ = ["load_eval_config", "register", "resolve_policy"]


def _fail(msg: str, code: int = 2) -> NoReturn:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


def resolve_policy(spec: str, *, request_timeout_s: float | None = None) -> Policy:
    """A policy from a spec string.

    ``py:module:attr`` imports ``attr`` (a Policy, or a zero-argument factory returning one);
    everything else goes to ``agentgym.policies.from_spec`` (``hf:...``, ``vllm:...``,
    ``openai:...``, ``expert``...). ``expert`` and ``hf:MODEL`` work even before that exists.
    ``request_timeout_s`` becomes an ``openai:`` policy's per-request HTTP timeout.
    """
    from agentgym.errors import ConfigurationError

    if spec.startswith("py:"):
        mod_name, _, attr = spec[3:].partition(":")
        if not mod_name or not attr:
            raise ConfigurationError(f"--policy {spec!r}: expected py:MODULE:ATTRIBUTE.")
        try:
            obj: Any = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigurationError(f"--policy {spec!r}: cannot import {attr} from {mod_name} ({e}).") from None
        if not hasattr(obj, "generate"):
            obj = obj()
        if not hasattr(obj, "generate") or not hasattr(obj, "policy_id"):
            raise ConfigurationError(f"--policy {spec!r} is not a Policy (needs policy_id and async generate()).")
        return obj  # type: ignore[no-any-return]
    try:
        policies = importlib.import_module("agentgym.policies")
    except ImportError:
        policies = None
    from_spec = getattr(policies, "from_spec", None)
    if callable(from_spec):
        kwargs: dict[str, Any] = {}
        if request_timeout_s is not None and spec.strip().startswith("openai:"):
            kwargs = {"timeout_s": request_timeout_s, "connect_timeout_s": min(5.0, request_timeout_s)}
        return from_spec(spec, **kwargs)  # type: ignore[no-any-return]
    if spec == "expert":
        from agentgym.policies.scripted import ExpertPolicy

        return ExpertPolicy()
    if spec.startswith("hf:") and len(spec) > 3:
        from agentgym.policies.hf import HFPolicy

        return HFPolicy(spec[3:], policy_id=spec)
    raise ConfigurationError(
        f"--policy {spec!r}: policy specs other than 'expert', 'hf:MODEL' and 'py:MODULE:ATTR' need "
        "agentgym.policies.from_spec, "
        "which this installation lacks.")


def _split_list(value: str, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise typer.BadParameter(f"{what} is empty")
    return items


def _parse_seeds(value: str) -> list[int]:
    out: list[int] = []
    for item in _split_list(value, "--seeds"):
        if "-" in item.lstrip("-") and not item.startswith("-"):
            lo, hi = item.split("-", 1)
            try:
                out += list(range(int(lo), int(hi) + 1))
            except ValueError:
                raise typer.BadParameter(f"bad seed range {item!r}; use e.g. 0,1,2 or 0-4") from None
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise typer.BadParameter(f"seeds must be integers, got {item!r}; use e.g. 0,1,2 or 0-4") from None
    return out


def _parse_split(value: str) -> tuple[str, dict[str, str]]:
    default: str | None = None
    overrides: dict[str, str] = {}
    for item in _split_list(value, "--split"):
        if "=" in item:
            env_id, _, name = item.partition("=")
            if not env_id.strip() or not name.strip():
                raise typer.BadParameter(f"bad --split item {item!r}; use ENV=SPLIT")
            from agentgym.registration import env_entry

            overrides[env_entry(env_id.strip()).id] = name.strip()
        elif default is None:
            default = item
        else:
            raise typer.BadParameter(f"--split names two default splits ({default!r}, {item!r})")
    return default or "test", overrides


def _parse_history(value: str) -> int | None:
    if value.lower() == "full":
        return None
    try:
        n = int(value)
    except ValueError:
        raise typer.BadParameter(f"--history must be 'full' or a number of turns, got {value!r}") from None
    if n < 0:
        raise typer.BadParameter("--history must be >= 0")
    return n


def _fmt_ci(block: dict[str, Any]) -> str:
    m, ci = block.get("mean"), block.get("ci95")
    if m is None:
        return "–"
    s = f"{100 * m:.1f}%"
    if ci:
        s += f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return s


def task_counts_line(tasks: dict[str, Any] | None) -> str:
    """``tasks: 290 loaded, 100 evaluated, 10 skipped (7 x reason A; 3 x reason B)``, or ``""``."""
    if not tasks:
        return ""
    line = f"tasks: {tasks.get('loaded', 0)} loaded, {tasks.get('evaluated', '?')} evaluated, "
    line += f"{tasks.get('skipped', 0)} skipped"
    reasons = tasks.get("skip_reasons") or {}
    if reasons:
        line += " (" + "; ".join(f"{n} x {r}" for r, n in reasons.items()) + ")"
    return line


def print_summary(summary: dict[str, Any]) -> None:
    """The rich results table."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 140)
    pol = summary.get("protocol", {}).get("policy", {})
    table = Table(title=f"agentgym eval · policy {pol.get('spec') or pol.get('policy_id')}")
    for col in ("env", "eps", "success [95% CI]", "reward", "pass@k", "turns", "tok/ep", "perr/turn", "trunc",
                "err", "s/ep"):
        table.add_column(col, justify="left" if col == "env" else "right", no_wrap=col != "env")
    rows = list(summary.get("envs", {}).items())
    if len(rows) > 1 and summary.get("overall"):
        rows.append(("overall", summary["overall"]))
    for name, b in rows:
        passk = b.get("pass_at_k", {})
        pk = max(passk, key=lambda k: int(k.split("@")[1]), default=None)
        pk_s = f"{pk}={100 * passk[pk]['mean']:.1f}%" if pk else "–"
        r = b["reward"].get("mean")
        perr = b["parse_errors"].get("per_turn")
        table.add_row(
            name.removeprefix("agentgym/"), str(b["episodes"]), _fmt_ci(b["success"]), "–" if r is None else f"{r:.3f}", pk_s,
            f"{b['turns']['mean']:.1f}" if b["turns"]["mean"] is not None else "–",
            f"{b['tokens']['generated_mean']:.0f}" if b["tokens"]["generated_mean"] is not None else "–",
            "–" if perr is None else f"{perr:.2f}", str(b["truncated"]), str(b["errors"]),
            f"{b['timings']['episode_wall_mean_s']:.2f}" if b["timings"]["episode_wall_mean_s"] is not None else "–",
        )
    console.print(table)
    for name, b in summary.get("envs", {}).items():
        line = task_counts_line(b.get("tasks"))
        if line:
            console.print(f"{name.removeprefix('agentgym/')}: {line}", highlight=False)
    if not summary.get("complete", True):
        console.print("[yellow]incomplete run: rerun the same command to resume.[/]")


_CONFIG_KEYS = {
    "env": str, "policy": str, "out": str, "split": str, "tasks": int, "samples": int, "seeds": str,
    "max_turns": int, "max_tokens": int, "max_total_tokens": int, "max_wall_s": float, "temperature": float,
    "top_p": float, "concurrency": int, "parser": str, "history": str, "env_kwarg": list,
    "retry_errors": bool, "sampling_seeds": bool, "batch_requests": bool, "quiet": bool,
    "request_timeout": float, "deadline": float, "env_workers": str,
}


def _read_summary(out: Path) -> dict[str, Any] | None:
    import json

    try:
        data = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _failures(summary: dict[str, Any]) -> tuple[int, int, str]:
    """``(failed, total, first error)`` over every env: an episode fails with an error, or when the
    policy did not answer in time (truncated by ``policy_timeout``)."""
    failed = total = 0
    example = ""
    for b in summary.get("envs", {}).values():
        total += int(b.get("episodes", 0))
        timeouts = int(b.get("truncated_reasons", {}).get("policy_timeout", 0))
        failed += int(b.get("errors", 0)) + timeouts
        if not example:
            errors = b.get("error_examples") or []
            example = str(errors[0]) if errors else ("the policy did not answer in time (policy_timeout)"
                                                     if timeouts else "")
    return failed, total, example


def load_eval_config(path: Path) -> dict[str, Any]:
    """Read an eval config (TOML whose keys are ``agentgym eval``'s long options, with ``_`` for ``-``).

    Lists are accepted for ``env`` and ``seeds``, and a table for ``env_kwarg``. Unknown keys and wrong
    types raise ``typer.BadParameter`` naming the key.
    """
    import tomllib

    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise typer.BadParameter(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise typer.BadParameter(f"config file {path} is not valid TOML: {e}") from None
    out: dict[str, Any] = {}
    for key, value in data.items():
        k = key.replace("-", "_")
        if k not in _CONFIG_KEYS:
            raise typer.BadParameter(f"{path}: unknown key {key!r}; known: {', '.join(sorted(_CONFIG_KEYS))}")
        if k in ("env", "seeds") and isinstance(value, list):
            value = ",".join(str(v) for v in value)
        if k == "env_kwarg" and isinstance(value, dict):
            import json

            value = [f"{a}={json.dumps(b)}" for a, b in value.items()]
        want = _CONFIG_KEYS[k]
        if k == "history" and isinstance(value, int):
            value = str(value)
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise typer.BadParameter(f"{path}: {key} must be {want.__name__}, got {type(value).__name__}")
        out[k] = value
    return out


def register(app: typer.Typer) -> None:
    """Add ``eval`` and ``report`` to the CLI."""

    @app.command("eval")
    def eval_cmd(
        ctx: typer.Context,
        env: Annotated[str | None, typer.Option("--env", "-e", help="Env id(s), comma-separated (agentgym/Demo-v0,...).")] = None,
        policy: Annotated[str | None, typer.Option("--policy", "-p", help="Policy spec: expert, hf:smollm2-135m-instruct, "
                                                   "vllm:..., openai:..., or py:MODULE:ATTR.")] = None,
        out: Annotated[Path | None, typer.Option("--out", "-o", help="Output directory (rerun to resume).")] = None,
        config_file: Annotated[Path | None, typer.Option("--config", "-c", help="TOML file of these options "
                                                         "(configs/eval/*.toml); command-line options win.")] = None,
        split: Annotated[str, typer.Option(help="Task split; 'test' falls back to an env's held-out split "
                                           "(ALFWorld: valid_unseen). Per env: test,agentgym/ALFWorld-v0=valid_seen")] = "test",
        tasks: Annotated[int | None, typer.Option(help="Tasks per env (default: the whole split).")] = None,
        samples: Annotated[int, typer.Option(help="Episodes per task and seed (the k of pass@k).")] = 1,
        seeds: Annotated[str, typer.Option(help="Seeds, e.g. 0,1,2 or 0-4 (CIs resample tasks, keeping their seeds together).")] = "0",
        max_turns: Annotated[int | None, typer.Option(help="Turns per episode (default: the env's limit).")] = None,
        max_tokens: Annotated[int, typer.Option(help="Tokens per generation.")] = 256,
        max_total_tokens: Annotated[int | None, typer.Option(help="Prompt+generated tokens per episode.")] = None,
        max_wall_s: Annotated[float | None, typer.Option(help="Wall-clock seconds per episode.")] = None,
        temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
        top_p: Annotated[float, typer.Option(help="Nucleus sampling.")] = 1.0,
        concurrency: Annotated[int, typer.Option(help="Episodes in flight.")] = 16,
        parser: Annotated[str | None, typer.Option(help="Override the env's parser: hermes, json, react.")] = None,
        history: Annotated[str, typer.Option(help="'full' or N: keep the last N turns (message mode).")] = "full",
        env_kwarg: Annotated[list[str] | None, typer.Option("--env-kwarg", help="key=value for the env constructor "
                                                            "(repeatable).")] = None,
        retry_errors: Annotated[bool, typer.Option("--retry-errors/--no-retry-errors",
                                                   help="On resume, rerun episodes that ended with an error.")] = True,
        sampling_seeds: Annotated[bool, typer.Option("--sampling-seeds/--no-sampling-seeds",
                                                     help="Seed every turn's sampling (reproducible where the "
                                                     "backend honours seeds).")] = True,
        batch_requests: Annotated[bool, typer.Option("--batch-requests/--no-batch-requests",
                                                     help="Coalesce concurrent turns into batched policy calls.")] = True,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
        request_timeout: Annotated[float | None, typer.Option(
            "--request-timeout", help="Seconds one policy request may take, retries included (an HTTP call's "
            "timeout for openai: policies); past it the episode is truncated (policy_timeout). Default: 600.")] = None,
        deadline: Annotated[float | None, typer.Option(
            "--deadline", help="Seconds the whole run may take; then it stops, keeps what finished and exits "
            "with status 3 (rerun to resume).")] = None,
        env_workers: Annotated[str, typer.Option(
            "--env-workers", help="'thread' (default) or 'process': each env in its own process, killed when a "
            "step or reset hangs past its timeout (for envs that can block in C code).")] = "thread",
    ) -> None:
        """Evaluate a policy over envs with a recorded protocol; writes episodes.jsonl and summary.json."""
        import asyncio

        from agentgym.cli import _parse_kwargs
        from agentgym.errors import AgentGymError
        from agentgym.eval.runner import EvalConfig, arun_eval

        if config_file is not None:
            try:
                given = load_eval_config(config_file)
            except typer.BadParameter as e:
                _fail(str(e))
            for key, value in given.items():
                source = ctx.get_parameter_source(key)
                if source is None or source.name not in ("COMMANDLINE", "ENVIRONMENT"):
                    ctx.params[key] = value
            p = ctx.params
            env, policy, out, split, tasks, samples, seeds = (p["env"], p["policy"], p["out"], p["split"], p["tasks"],
                                                              p["samples"], p["seeds"])
            max_turns, max_tokens, max_total_tokens, max_wall_s = (p["max_turns"], p["max_tokens"],
                                                                   p["max_total_tokens"], p["max_wall_s"])
            temperature, top_p, concurrency, parser, history = (p["temperature"], p["top_p"], p["concurrency"],
                                                                p["parser"], p["history"])
            env_kwarg, retry_errors, sampling_seeds, batch_requests, quiet = (
                p["env_kwarg"], p["retry_errors"], p["sampling_seeds"], p["batch_requests"], p["quiet"])
            request_timeout, deadline, env_workers = p["request_timeout"], p["deadline"], p["env_workers"]
        missing = [n for n, v in (("--env", env), ("--policy", policy), ("--out", out)) if v is None]
        if missing:
            _fail(f"missing {', '.join(missing)} (give them on the command line or in --config).")
        assert env is not None and policy is not None and out is not None
        out = Path(out)
        try:
            for name, value in (("--request-timeout", request_timeout), ("--deadline", deadline)):
                if value is not None and not value > 0:
                    raise typer.BadParameter(f"{name} must be a positive number of seconds, got {value}")
            split_name, split_overrides = _parse_split(split)
            seed_list = _parse_seeds(seeds)
            window = _parse_history(history)
            config = EvalConfig(
                envs=_split_list(env, "--env"), split=split_name, split_overrides=split_overrides, tasks=tasks, samples=samples, seeds=seed_list,
                max_turns=max_turns, max_total_tokens=max_total_tokens, max_wall_s=max_wall_s,
                max_tokens=max_tokens, temperature=temperature, top_p=top_p, concurrency=concurrency,
                parser=parser, history_window=window, env_kwargs=_parse_kwargs(env_kwarg),
                retry_errors=retry_errors, policy_spec=policy, sampling_seeds=sampling_seeds,
                batch_requests=batch_requests, env_workers=env_workers)
            if request_timeout is not None:
                config.policy_timeout_s = float(request_timeout)
            config.validate()
            from agentgym.registration import env_entry

            for env_id in config.envs:
                env_entry(env_id)
        except typer.BadParameter as e:
            _fail(str(e))
        except AgentGymError as e:
            _fail(str(e))
        if out.exists() and not out.is_dir():
            _fail(f"--out {out} exists and is not a directory.")
        try:
            pol = resolve_policy(policy, request_timeout_s=request_timeout)
        except AgentGymError as e:
            _fail(str(e))
        except Exception as e:  # a backend failing to load: say which and why
            _fail(f"could not create policy {policy!r}: {type(e).__name__}: {e}")

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        progress = Progress(TextColumn("[bold]eval[/]"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("success {task.fields[succ]}"), TimeElapsedColumn(),
                            console=console, disable=quiet, transient=False)
        task = progress.add_task("eval", total=None, succ="–")
        counts = {"n": 0, "ok": 0, "err": 0}

        def on_progress(done: int, total: int, traj: Any) -> None:
            if traj is not None:
                counts["n"] += 1
                counts["ok"] += int(traj.success)
                counts["err"] += int(traj.error is not None)
            succ = f"{counts['ok']}/{counts['n']}" + (f" ({counts['err']} errors)" if counts["err"] else "")
            progress.update(task, completed=done, total=total, succ=succ)

        summary: dict[str, Any] | None = None

        async def run_and_close() -> dict[str, Any]:
            try:
                return await asyncio.wait_for(arun_eval(pol, config, out, progress=on_progress), deadline)
            finally:
                await pol.aclose()  # the policy's lifecycle: engines, processes, connections

        timed_out = False
        try:
            with progress:
                summary = asyncio.run(run_and_close())
        except KeyboardInterrupt:
            console.print(f"[yellow]interrupted[/]: finished episodes are in {out}/episodes.jsonl; "
                          "rerun the same command to resume.")
            raise typer.Exit(130) from None
        except (TimeoutError, asyncio.TimeoutError):
            timed_out = True
            summary = _read_summary(out)
        except AgentGymError as e:
            _fail(str(e))
        if summary is not None:
            print_summary(summary)
            typer.echo(f"wrote {out}/episodes.jsonl and {out}/summary.json")
        if timed_out:
            done = sum(int(b.get("episodes", 0)) for b in (summary or {}).get("envs", {}).values())
            console.print(f"[bold red]deadline reached[/]: the run was stopped after {deadline:g} s with {done} "
                          f"episode(s) finished; rerun the same command to resume.", highlight=False)
            raise typer.Exit(3)
        failed, total, example = _failures(summary or {})
        if total and failed == total:
            console.print(f"[bold red]every episode failed[/] ({failed} of {total}: an error, or no answer from the "
                          f"policy in time). First error: {example}", highlight=False)
            raise typer.Exit(1)
        if failed:
            console.print(f"[yellow]{failed} of {total} episodes failed[/] (an error, or no answer from the policy "
                          f"in time). First error: {example}", highlight=False)

    @app.command("report")
    def report_cmd(
        runs: Annotated[list[Path], typer.Argument(help="Output directories of `agentgym eval` runs.")],
        out: Annotated[Path, typer.Option("--out", "-o", help="Report directory (report.md + PNGs).")] = Path("report"),
        plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Draw PNG plots (matplotlib).")] = True,
    ) -> None:
        """Compare eval runs side by side: success by env, by task type and by number of turns."""
        from agentgym.errors import AgentGymError
        from agentgym.eval.report import write_report

        try:
            path = write_report(list(runs), out, plots=plots)
        except AgentGymError as e:
            _fail(str(e))
        except ImportError as e:
            _fail(f"plots need matplotlib ({e}); install agentgym[report] or pass --no-plots.")
        typer.echo(path.read_text())
        typer.echo(f"wrote {path}")
