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
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import Field, field_validator

from agentgym.cli.common import fail, key_values
from agentgym.config import ConfigModel
from agentgym.errors import ConfigurationError

if TYPE_CHECKING:
    from agentgym.eval.runner import EvalConfig
    from agentgym.policy import Policy

__all__ = ["EvalOptions", "register", "resolve_policy"]


def resolve_policy(spec: str, *, request_timeout_s: float | None = None) -> Policy:
    """A policy from a spec string.

    ``py:module:attr`` imports ``attr`` (a Policy, or a zero-argument factory returning one); every
    other spec goes to :func:`agentgym.policies.from_spec` (``expert``, ``hf:...``, ``vllm:...``,
    ``openai:...``). ``request_timeout_s`` becomes an ``openai:`` policy's per-request HTTP timeout.
    """
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
    from agentgym.policies import from_spec

    kwargs: dict[str, Any] = {}
    if request_timeout_s is not None and spec.strip().startswith("openai:"):
        kwargs = {"timeout_s": request_timeout_s, "connect_timeout_s": min(5.0, request_timeout_s)}
    return from_spec(spec, **kwargs)


def _items(value: Any) -> list[Any]:
    """A comma-separated string (the command line) or a list (a TOML file), as a list of items."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(f"expected a comma-separated string or a list, got {type(value).__name__}")


def _seeds(value: Any) -> list[int]:
    out: list[int] = []
    for item in _items(value):
        if isinstance(item, int) and not isinstance(item, bool):
            out.append(item)
            continue
        text = str(item)
        if "-" in text.lstrip("-") and not text.startswith("-"):
            lo, hi = text.split("-", 1)
            try:
                out += list(range(int(lo), int(hi) + 1))
            except ValueError:
                raise ValueError(f"bad seed range {text!r}; use e.g. 0,1,2 or 0-4") from None
            continue
        try:
            out.append(int(text))
        except ValueError:
            raise ValueError(f"seeds must be integers, got {text!r}; use e.g. 0,1,2 or 0-4") from None
    return out


def _env_kwargs(value: Any) -> dict[str, Any]:
    """``["key=value", ...]`` (values parsed as JSON where possible) or a TOML table."""
    if isinstance(value, dict):
        return dict(value)
    return key_values(value if isinstance(value, (list, tuple)) else [value])


class EvalOptions(ConfigModel):
    """``agentgym eval``'s options, typed: from the command line, a ``--config`` TOML file, or both.

    The file's keys are the long options with ``_`` for ``-``; ``env`` and ``seeds`` may be lists and
    ``env_kwarg`` a table. :meth:`eval_config` turns the options into the
    :class:`~agentgym.eval.runner.EvalConfig` protocol, whose defaults hold for every option left
    unset (``None``); the rest (``policy``, ``out``, ``quiet``, ``request_timeout``, ``deadline``) is how
    this command runs it.
    """

    env: list[str] | None = None
    policy: str | None = None
    out: Path | None = None
    split: str | None = None
    tasks: int | None = None
    samples: int | None = None
    seeds: list[int] | None = None
    max_turns: int | None = None
    max_tokens: int | None = None
    max_total_tokens: int | None = None
    max_wall_s: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    concurrency: int | None = None
    parser: str | None = None
    history: int | None = None  # "full" (the default) parses to None
    env_kwarg: dict[str, Any] | None = None
    retry_errors: bool | None = None
    sampling_seeds: bool | None = None
    batch_requests: bool | None = None
    quiet: bool = False
    request_timeout: float | None = Field(default=None, gt=0)
    deadline: float | None = Field(default=None, gt=0)
    env_workers: str | None = None

    @field_validator("env", mode="before")
    @classmethod
    def _env_list(cls, v: Any) -> list[Any] | None:
        return None if v is None else _items(v)

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_list(cls, v: Any) -> list[int] | None:
        return None if v is None else _seeds(v)

    @field_validator("env_kwarg", mode="before")
    @classmethod
    def _kwargs(cls, v: Any) -> dict[str, Any] | None:
        return None if v is None else _env_kwargs(v)

    @field_validator("history", mode="before")
    @classmethod
    def _history(cls, v: Any) -> int | None:
        if v is None or (isinstance(v, str) and v.strip().lower() == "full"):
            return None
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"must be 'full' or a number of turns, got {v!r}") from None
        if n < 0:
            raise ValueError(f"must be 'full' or a number of turns >= 0, got {n}")
        return n

    @field_validator("env")
    @classmethod
    def _some_env(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("is empty")
        return v

    @classmethod
    def load(cls, path: Path) -> dict[str, Any]:
        """The options a TOML file sets (checked: unknown keys and wrong types name the key and the file)."""
        import tomllib

        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigurationError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigurationError(f"config file {path} is not valid TOML: {e}") from None
        data = {k.replace("-", "_"): v for k, v in data.items()}
        checked = cls.from_dict(data, source=str(path))
        return {k: getattr(checked, k) for k in data}

    @classmethod
    def from_sources(cls, command_line: dict[str, Any], config_file: Path | None = None) -> EvalOptions:
        """Options from a file (if any) overridden by every option given on the command line."""
        data = cls.load(config_file) if config_file is not None else {}
        data.update({k: v for k, v in command_line.items() if v is not None})
        return cls.from_dict(data, source="agentgym eval", label=_option_name)

    def split_overrides(self) -> tuple[str | None, dict[str, str]]:
        """``--split test,agentgym/ALFWorld-v0=valid_seen`` -> ``("test", {"agentgym/ALFWorld-v0": "valid_seen"})``."""
        from agentgym.registration import env_entry

        default: str | None = None
        overrides: dict[str, str] = {}
        for item in _items(self.split or ""):
            env_id, sep, name = str(item).partition("=")
            if sep:
                if not env_id.strip() or not name.strip():
                    raise ConfigurationError(f"--split: bad item {item!r}; use ENV=SPLIT")
                overrides[env_entry(env_id.strip()).id] = name.strip()
            elif default is None:
                default = str(item)
            else:
                raise ConfigurationError(f"--split names two default splits ({default!r}, {item!r})")
        return default, overrides

    def eval_config(self) -> EvalConfig:
        """The eval protocol these options describe; a bad value names its command-line option.

        Raises:
            ConfigurationError: a bad value, or an unknown env id (:class:`~agentgym.errors.UnknownEnvError`).
        """
        from agentgym.eval.runner import EvalConfig
        from agentgym.registration import env_entry

        split, overrides = self.split_overrides()
        given = dict(
            envs=self.env or [], split=split, split_overrides=overrides, tasks=self.tasks, samples=self.samples,
            seeds=self.seeds, max_turns=self.max_turns, max_total_tokens=self.max_total_tokens,
            max_wall_s=self.max_wall_s, max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
            concurrency=self.concurrency, parser=self.parser, history_window=self.history, env_kwargs=self.env_kwarg,
            retry_errors=self.retry_errors, policy_spec=self.policy, sampling_seeds=self.sampling_seeds,
            batch_requests=self.batch_requests, env_workers=self.env_workers, policy_timeout_s=self.request_timeout)
        fields = {k: v for k, v in given.items() if v is not None}  # unset: EvalConfig's default
        config = EvalConfig.from_dict(fields, source="agentgym eval", label=_option_name)
        for env_id in config.envs:
            env_entry(env_id)  # UnknownEnvError with a did-you-mean
        return config


# EvalConfig fields whose command-line option has another name
_OPTION_OF = {"envs": "env", "history_window": "history", "env_kwargs": "env-kwarg", "split_overrides": "split",
              "policy_timeout_s": "request-timeout", "policy_spec": "policy"}


def _option_name(field: str) -> str:
    return "--" + _OPTION_OF.get(field, field).replace("_", "-")


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


def _checked_eval_config(opts: EvalOptions) -> EvalConfig:
    """The protocol, with the required options present, every env id known and ``--out`` usable."""

    missing = [n for n, v in (("--env", opts.env), ("--policy", opts.policy), ("--out", opts.out)) if v is None]
    if missing:
        raise ConfigurationError(f"missing {', '.join(missing)} (give them on the command line or in --config).")
    config = opts.eval_config()
    assert opts.out is not None
    if opts.out.exists() and not opts.out.is_dir():
        raise ConfigurationError(f"--out {opts.out} exists and is not a directory.")
    return config


def _run_with_progress(pol: Policy, config: EvalConfig, opts: EvalOptions) -> tuple[dict[str, Any] | None, bool]:
    """Run the eval under ``--deadline`` with a progress bar; close the policy. Returns ``(summary, timed_out)``."""
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentgym.errors import AgentGymError
    from agentgym.eval.runner import arun_eval

    assert opts.out is not None
    out = opts.out
    console = Console(stderr=True)
    progress = Progress(TextColumn("[bold]eval[/]"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("success {task.fields[succ]}"), TimeElapsedColumn(),
                        console=console, disable=opts.quiet, transient=False)
    task = progress.add_task("eval", total=None, succ="–")
    counts = {"n": 0, "ok": 0, "err": 0}

    def on_progress(done: int, total: int, traj: Any) -> None:
        if traj is not None:
            counts["n"] += 1
            counts["ok"] += int(traj.success)
            counts["err"] += int(traj.error is not None)
        succ = f"{counts['ok']}/{counts['n']}" + (f" ({counts['err']} errors)" if counts["err"] else "")
        progress.update(task, completed=done, total=total, succ=succ)

    async def run_and_close() -> dict[str, Any]:
        try:
            return await asyncio.wait_for(arun_eval(pol, config, out, progress=on_progress), opts.deadline)
        finally:
            await pol.aclose()  # the policy's lifecycle: engines, processes, connections

    try:
        with progress:
            return asyncio.run(run_and_close()), False
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: finished episodes are in {out}/episodes.jsonl; "
                      "rerun the same command to resume.")
        raise typer.Exit(130) from None
    except (TimeoutError, asyncio.TimeoutError):
        return _read_summary(out), True
    except AgentGymError as e:
        fail(str(e))


def _report_outcome(summary: dict[str, Any] | None, opts: EvalOptions, timed_out: bool) -> None:
    """Print the table and exit with the documented status (3: deadline, 1: every episode failed)."""
    from rich.console import Console

    console = Console(stderr=True)
    if summary is not None:
        print_summary(summary)
        typer.echo(f"wrote {opts.out}/episodes.jsonl and {opts.out}/summary.json")
    if timed_out:
        done = sum(int(b.get("episodes", 0)) for b in (summary or {}).get("envs", {}).values())
        console.print(f"[bold red]deadline reached[/]: the run was stopped after {opts.deadline:g} s with {done} "
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
        split: Annotated[str | None, typer.Option(help="Task split; 'test' falls back to an env's held-out split "
                                                  "(ALFWorld: valid_unseen). Per env: test,agentgym/ALFWorld-v0=valid_seen",
                                                  show_default="test")] = None,
        tasks: Annotated[int | None, typer.Option(help="Tasks per env (default: the whole split).")] = None,
        samples: Annotated[int | None, typer.Option(help="Episodes per task and seed (the k of pass@k).",
                                                    show_default="1")] = None,
        seeds: Annotated[str | None, typer.Option(help="Seeds, e.g. 0,1,2 or 0-4 (CIs resample tasks, keeping their seeds together).",
                                                  show_default="0")] = None,
        max_turns: Annotated[int | None, typer.Option(help="Turns per episode (default: the env's limit).")] = None,
        max_tokens: Annotated[int | None, typer.Option(help="Tokens per generation.", show_default="256")] = None,
        max_total_tokens: Annotated[int | None, typer.Option(help="Prompt+generated tokens per episode.")] = None,
        max_wall_s: Annotated[float | None, typer.Option(help="Wall-clock seconds per episode.")] = None,
        temperature: Annotated[float | None, typer.Option(help="Sampling temperature.", show_default="1.0")] = None,
        top_p: Annotated[float | None, typer.Option(help="Nucleus sampling.", show_default="1.0")] = None,
        concurrency: Annotated[int | None, typer.Option(help="Episodes in flight.", show_default="16")] = None,
        parser: Annotated[str | None, typer.Option(help="Override the env's parser: hermes, json, react.")] = None,
        history: Annotated[str | None, typer.Option(help="'full' or N: keep the last N turns (message mode).",
                                                    show_default="full")] = None,
        env_kwarg: Annotated[list[str] | None, typer.Option("--env-kwarg", help="key=value for the env constructor "
                                                            "(repeatable).")] = None,
        retry_errors: Annotated[bool | None, typer.Option("--retry-errors/--no-retry-errors", show_default="retry",
                                                          help="On resume, rerun episodes that ended with an error.")] = None,
        sampling_seeds: Annotated[bool | None, typer.Option("--sampling-seeds/--no-sampling-seeds", show_default="on",
                                                            help="Seed every turn's sampling (reproducible where the "
                                                            "backend honours seeds).")] = None,
        batch_requests: Annotated[bool | None, typer.Option("--batch-requests/--no-batch-requests", show_default="on",
                                                            help="Coalesce concurrent turns into batched policy calls.")] = None,
        quiet: Annotated[bool | None, typer.Option("--quiet", "-q", help="No progress bar.")] = None,
        request_timeout: Annotated[float | None, typer.Option(
            "--request-timeout", help="Seconds one policy request may take, retries included (an HTTP call's "
            "timeout for openai: policies); past it the episode is truncated (policy_timeout). Default: 600.")] = None,
        deadline: Annotated[float | None, typer.Option(
            "--deadline", help="Seconds the whole run may take; then it stops, keeps what finished and exits "
            "with status 3 (rerun to resume).")] = None,
        env_workers: Annotated[str | None, typer.Option(
            "--env-workers", show_default="thread", help="'thread' or 'process': each env in its own process, killed "
            "when a step or reset hangs past its timeout (for envs that can block in C code).")] = None,
    ) -> None:
        """Evaluate a policy over envs with a recorded protocol; writes episodes.jsonl and summary.json."""
        from agentgym.errors import AgentGymError

        given = {k: v for k, v in ctx.params.items() if k != "config_file"}
        try:
            opts = EvalOptions.from_sources(given, config_file)
            config = _checked_eval_config(opts)
        except AgentGymError as e:
            fail(str(e))
        assert opts.policy is not None and opts.out is not None
        try:
            pol = resolve_policy(opts.policy, request_timeout_s=opts.request_timeout)
        except AgentGymError as e:
            fail(str(e))
        except Exception as e:  # a backend failing to load: say which and why
            fail(f"could not create policy {opts.policy!r}: {type(e).__name__}: {e}")
        summary, timed_out = _run_with_progress(pol, config, opts)
        _report_outcome(summary, opts, timed_out)

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
            fail(str(e))
        except ImportError as e:
            fail(f"plots need matplotlib ({e}); install agentgym[report] or pass --no-plots.")
        typer.echo(path.read_text())
        typer.echo(f"wrote {path}")
