"""``agentgym/OS-v0``: AgentBench's OS-interaction tasks, each in its own Docker container.

Reads AgentBench's OS JSON (``data/os_interaction/data/*/*.json``: a list of tasks, or one task
per file, or JSONL). A task::

    {"description": "How many hidden files are in /home?",
     "create": {"local": "default", "init": {"code": "echo 1 > /home/.a"}},   # or {"file": ...}, a list,
                                                                             # a string, "language": "python"
     "start": "python3 -c '...' &",                                          # optional, a background process
     "evaluation": {"check": [null, {"language": "python", "file": "check/integer-match.py"}],
                    "example": {"code": "ls -a /home | grep '^\\\\.' | wc -l"}}}  # or {"match": "6"}

Each episode runs in a fresh container (:mod:`.os_shell`) from a locally built image
(:mod:`.os_image`), as root, with ``--network none``, memory, CPU, process, file-size and total
written-data limits (the image stays read-only; writes land in a capped tmpfs overlay).
As in AgentBench: the ``init`` scripts run first, each as its own ``bash -c``/``python3 -c``
process (a failing one fails the task's setup); ``start`` is typed into the agent's shell, so its
background jobs live there; the agent gets one persistent ``bash --login`` on a TTY; output is cut
to 800 characters (``[truncated because the output is too long]``).

Tools, named as in AgentBench's function-calling version: ``bash_action(script)``,
``answer_action(answer)``, ``finish_action()``. AgentBench's text protocol (``Act: bash`` with a
```bash block, ``Act: answer(...)``, ``Act: finish``) is accepted too.

Scoring, as AgentBench's ``_judge``: ``match`` compares the answer with ``answer`` (stripped
first when ``strip``; a plain string means ``strip``) or searches ``regex`` in it; ``check`` runs
the scripts in order inside the container with arguments ``[answer, output of script 1, ...]``
(``None`` entries run the ``example`` script), and passes when every one exits with 0.
``finish_action`` answers ``None`` (``"None"`` to a checker).

Checks cannot be forged from inside (unlike AgentBench): before they run, every process the agent
left is killed, and they execute the image's own programs, libraries, loader and code-loading
configuration whatever the agent overwrote (see :meth:`.os_shell.OSContainer.seal` and
``docs/os-v0-security.md``). They still read the state the agent left, as AgentBench's do.

Differences: one image serves every ``create.local`` (``default``, ``packages``, ``ubuntu``): it
has the host's tools (see :mod:`.os_image`), not Ubuntu's ``apt`` or ``npm``; ``c``/``c++``
scripts are not supported (no compiler in the image): such tasks are left out and counted. Checks
run after the agent's processes (and background ``start`` jobs) are killed; they see the image's
version of every file the image has under ``/usr`` (the agent's additions are visible, its edits
to the image's own files are not), with ``/`` itself read-only.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shlex
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.core import AgentEnv, StepResult
from agentgym.errors import ConfigurationError, EnvError, SandboxError, SandboxUnavailable
from agentgym.loading import LoadReport, read_rows
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

from .env import format_call

__all__ = ["OSEnv", "judge", "load_os_tasks"]

log = logging.getLogger(__name__)
ENV = "OS-v0"
LANGUAGES = ("bash", "python")
TRUNCATE_AT = 800
SYSTEM_PROMPT = (
    "You are an assistant that will act like a person. I will play the role of a Linux (Ubuntu) operating system.\n"
    "Your goal is to implement the operations required by me or answer the questions proposed by me.\n"
    "For each of your turns, you should first think about what you should do, and then call exactly one of the "
    "provided tools according to the situation.\n"
    "If the output is too long, I will truncate it. The truncated output is not complete. You have to deal with "
    "the truncating problem by yourself.\n"
    "Attention, your bash code should not contain any input operation. Once again, you should use one tool in each "
    "turn.\n"
    "Note that if you think the task has been finished, or there is some message missing to completely complete "
    "the task, you should respond with calling the function \"finish_action\", as no additional information will "
    "be provided.\n"
    "Also, note that if you have gotten the answer to the question, you should call the \"answer_action\" tool "
    "instead of simply writing your answer in your response.\n"
    "Your answers should be exact and precise (for example, a single number), do not answer with full sentences "
    "or phrases."
)
_IMAGE_LOCK = threading.Lock()
_IMAGE: dict[str, str] = {}


# ---------------------------------------------------------------------------- loading
def _script_dir_for(file: Path) -> Path:
    """AgentBench's layout: ``data/<N>/x.json`` reads scripts from ``scripts/<N>/``, ``data/dev.json``
    from ``scripts/dev/``; otherwise the file's own folder."""
    d = file.parent
    for cand in (d.parent.parent / "scripts" / d.name, d.parent / "scripts" / file.stem):
        if cand.is_dir():
            return cand.resolve()
    return d


class _Skip(Exception):
    """A task that cannot run here; the message is the reason."""


def _script(obj: Any, script_dir: Path) -> list[str] | None:
    """AgentBench's script object -> ``[language, code]`` (``None`` stays ``None``)."""
    if obj is None:
        return None
    if isinstance(obj, str):
        return ["bash", obj]
    if not isinstance(obj, dict):
        raise _Skip("a script is neither a string nor an object")
    lang = str(obj.get("language", "bash"))
    if lang not in LANGUAGES:
        raise _Skip(f"{lang} scripts are not supported (no compiler in the image)")
    if "file" in obj:
        f = script_dir / str(obj["file"])
        try:
            return [lang, f.read_text(encoding="utf-8")]
        except (OSError, UnicodeDecodeError):
            raise _Skip("script file not found") from None
    if "code" in obj:
        return [lang, str(obj["code"])]
    raise _Skip("a script object has neither 'file' nor 'code'")


def _task_data(item: Any, script_dir: Path) -> dict[str, Any]:
    if not isinstance(item, dict) or not isinstance(item.get("description"), str):
        raise _Skip("not a task object with a description")
    create = item.get("create")
    init: list[list[str]] = []
    image = "default"
    if isinstance(create, dict):
        image = str(create.get("local", create.get("image", "default")))
        raw_init = create.get("init")
        if raw_init is not None:
            for s in raw_init if isinstance(raw_init, list) else [raw_init]:
                sc = _script(s, script_dir)
                if sc is not None:
                    init.append(sc)
    start = _script(item["start"], script_dir) if item.get("start") is not None else None
    ev = item.get("evaluation")
    if not isinstance(ev, dict):
        raise _Skip("no evaluation")
    evaluation: dict[str, Any]
    if "match" in ev:
        m = ev["match"]
        if isinstance(m, str):
            evaluation = {"match": {"answer": m, "strip": True}}
        elif isinstance(m, dict) and ("answer" in m or "regex" in m):
            evaluation = {"match": {k: m[k] for k in ("answer", "regex", "strip") if k in m}}
        else:
            raise _Skip("evaluation.match is neither a string nor {answer|regex}")
    elif "check" in ev:
        raw = ev["check"]
        checks = [_script(s, script_dir) for s in (raw if isinstance(raw, list) else [raw])]
        example = _script(ev["example"], script_dir) if ev.get("example") is not None else None
        if any(c is None for c in checks) and example is None:
            raise _Skip("a check step runs the example script, but there is none")
        evaluation = {"check": checks, "example": example}
    else:
        raise _Skip("evaluation has neither match nor check")
    return {"description": item["description"], "init": init, "start": start, "evaluation": evaluation,
            "image": image, "labels": list(item.get("labels") or [])}


def load_os_tasks(path: str | os.PathLike[str], *, script_dir: str | os.PathLike[str] | None = None,
                  split: str = "test", report: LoadReport | None = None) -> list[TaskSpec]:
    """AgentBench OS tasks from a JSON/JSONL file, a folder of them (searched recursively) or a glob
    (``.../data/[1-7]/*.json``: AgentBench's ``os-std`` set, without ``dev.json`` or backups).

    Script files (``{"file": ...}``) are read from ``script_dir``, or from AgentBench's layout
    (``data/<N>/*.json`` -> ``scripts/<N>/``), or from the task file's folder. Tasks that cannot run
    here are left out and recorded in ``report``.
    """
    root = Path(path).expanduser()
    if any(ch in str(path) for ch in "*?["):  # a glob, as AgentBench's config names its files
        files = sorted(Path(p) for p in glob.glob(str(root), recursive=True) if p.endswith((".json", ".jsonl")))
        base = Path(os.path.commonpath([str(f.parent) for f in files])) if files else root.parent
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
        base = root
    elif root.is_file():
        files, base = [root], root.parent
    else:
        raise ConfigurationError(f"{ENV}: path {str(root)!r} does not exist.")
    if not files:
        raise ConfigurationError(f"{ENV}: no .json or .jsonl task file under {str(root)!r}.")
    report = report if report is not None else LoadReport(ENV, source=str(root))
    tasks: list[TaskSpec] = []
    for f in files:
        sdir = Path(script_dir).expanduser() if script_dir is not None else _script_dir_for(f)
        rel = f.relative_to(base).with_suffix("").as_posix()
        for i, item in enumerate(read_rows(f, source=ENV)):
            try:
                data = _task_data(item, sdir)
            except _Skip as e:
                report.skip(f"{rel} #{i}", str(e))
                continue
            if data["image"] != "default":
                report.note(f"create.local {data['image']!r} served by the one local image")
            data["source"] = f"{rel} #{i}"
            task_type = "check" if "check" in data["evaluation"] else "match"
            tasks.append(TaskSpec(f"{rel}/{i}", split, task_type, data))
    report.loaded = len(tasks)
    return tasks


# ---------------------------------------------------------------------------- scoring
def judge(evaluation: dict[str, Any], answer: Any, run_script: Any | None = None) -> tuple[bool, list[dict[str, Any]]]:
    """AgentBench's verdict on ``answer``; returns ``(passed, steps)`` (each check script's exit and output).

    ``run_script(language, code, params)`` runs a check inside the task's container and returns an
    object with ``exit_code`` and ``stdout``.
    """
    if "match" in evaluation:
        m = evaluation["match"]
        a = answer.strip() if isinstance(answer, str) and m.get("strip", False) else answer
        if "answer" in m:
            return a == m["answer"], []
        return isinstance(a, str) and re.search(str(m["regex"]), a) is not None, []
    if run_script is None:
        raise ConfigurationError("a check evaluation needs the task's container")
    params = [str(answer)]
    steps: list[dict[str, Any]] = []
    for script in evaluation["check"]:
        lang, code = script if script is not None else evaluation["example"]
        res = run_script(lang, code, list(params))
        steps.append({"exit_code": res.exit_code, "stdout": res.stdout[-2000:], "example": script is None})
        if res.exit_code != 0:
            return False, steps
        params.append(res.stdout)
    return True, steps


_ACT = re.compile(r"Act:\s*(.+)")
_BASH_BLOCK = re.compile(r"```bash\n(.*?)\n```", re.DOTALL)


def parse_agentbench_text(raw: str) -> tuple[str, str | None] | None:
    """AgentBench's text actions: ``("bash", code)``, ``("answer", text)``, ``("finish", None)`` or ``None``."""
    for action in reversed(_ACT.findall(raw)):
        low = action.lower()
        if low.startswith("bash"):
            blocks = _BASH_BLOCK.findall(raw)
            return ("bash", "\n\n".join(blocks)) if blocks else None
        if low.startswith("finish"):
            return "finish", None
        if low.startswith("answer"):
            content = action[6:].strip()
            lo, hi = content.find("("), content.rfind(")")
            if lo == -1 or hi == -1:
                continue
            return "answer", content[lo + 1:hi]
    return None


# ---------------------------------------------------------------------------- env
class OSEnv(AgentEnv):
    """AgentBench OS-interaction tasks in per-episode Docker containers (see the module docstring).

    Args:
        path: An AgentBench OS task file (``.json``/``.jsonl``), a folder of them, or a glob, e.g.
            AgentBench's ``data/os_interaction/data/dev.json`` or ``data/os_interaction/data/[1-7]/*.json``.
        script_dir: Where ``{"file": ...}`` scripts live (default: AgentBench's layout, see :func:`load_os_tasks`).
        split: The split name the tasks get.
        image: A Docker image to use instead of the locally built one (it needs bash, coreutils, python3 with
            ctypes, and a ``/mnt`` directory: the guard runs from it too).
        memory_mb, cpus, pids_limit, file_mb: Container limits (AgentBench: 1 GiB; here 1 CPU, 256 processes,
            512 MiB per file).
        disk_mb: Everything written in the container together (a tmpfs over the read-only image, so it
            also counts against ``memory_mb``); writes past it fail with "No space left on device".
        command_timeout_s: Deadline of one ``bash_action`` (then Ctrl-C, then the job is killed). AgentBench: 30 s.
        script_timeout_s: Deadline of each init, start and check script.
        max_output_chars: Longer shell output is cut as AgentBench cuts it (800).
        parser, format_penalty, render_mode: See :class:`~agentgym.core.AgentEnv`.
    """

    family = "code"
    default_parser = "hermes"
    splits: ClassVar[tuple[str, ...]] = ("test",)
    default_split = "test"

    def __init__(self, path: str | os.PathLike[str] | None = None, *, script_dir: str | os.PathLike[str] | None = None,
                 split: str = "test", image: str | None = None, memory_mb: int = 1024, cpus: float = 1.0,
                 pids_limit: int = 256, file_mb: int = 512, disk_mb: int = 512, command_timeout_s: float = 30.0,
                 script_timeout_s: float = 60.0, max_output_chars: int = TRUNCATE_AT, **kwargs: Any) -> None:
        if path is None or str(path) == "":
            raise ConfigurationError(
                f"{ENV} needs path=: an AgentBench OS task file or folder. Example: "
                "agentgym.make('agentgym/OS-v0', path='AgentBench/data/os_interaction/data/dev.json').")
        if min(memory_mb, pids_limit, file_mb, disk_mb, command_timeout_s, script_timeout_s, max_output_chars, cpus) <= 0:
            raise ConfigurationError(f"{ENV}: limits and timeouts must be positive.")
        super().__init__(**kwargs)
        self.splits = (split,)  # type: ignore[misc]
        self.default_split = split  # type: ignore[misc]
        self.load_log = LoadReport(ENV, source=str(path))
        self._tasks = load_os_tasks(path, script_dir=script_dir, split=split, report=self.load_log)
        self.load_log.warn(log)
        if not self._tasks:
            raise ConfigurationError(f"{ENV}: {str(path)!r} holds no usable task ({self.load_log.summary()}).")
        self.image = image
        self.limits: dict[str, Any] = {"memory_mb": int(memory_mb), "cpus": float(cpus), "pids_limit": int(pids_limit),
                                       "file_mb": int(file_mb), "disk_mb": int(disk_mb)}
        self.command_timeout_s = float(command_timeout_s)
        self.script_timeout_s = float(script_timeout_s)
        self.max_output_chars = int(max_output_chars)
        self._client: Any = None
        self._box: Any = None
        self._answer: Any = None
        self._expert_output: str | None = None
        self.last_check: dict[str, Any] = {}

    def tasks(self, split: str = "test") -> Sequence[TaskSpec]:
        return self._tasks if split in self.splits else []

    # ------------------------------------------------------------------ containers
    def _docker(self) -> Any:
        if self._client is None:
            from .os_shell import docker_client, remove_stale_containers

            self._client = docker_client()
            remove_stale_containers(self._client)
        return self._client

    def _image(self) -> str:
        if self.image is not None:
            return self.image
        with _IMAGE_LOCK:
            if "tag" not in _IMAGE:
                from .os_image import ensure_os_image

                _IMAGE["tag"] = ensure_os_image(self._docker())
            return _IMAGE["tag"]

    def _close_box(self) -> None:
        if self._box is not None:
            self._box.close()
            self._box = None

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT + "\n" + self.parser.format_instructions(self.tools)

    def reset_task(self, task: TaskSpec) -> list[Message]:
        from .os_shell import OSContainer

        self._close_box()
        self._answer = None
        self._expert_output = None
        self.last_check = {}
        d = task.data
        try:
            self._box = OSContainer(self._docker(), self._image(), **self.limits)
        except SandboxUnavailable as e:
            if self.image is not None or "No such image" not in str(e):
                raise
            with _IMAGE_LOCK:  # the image was removed under us (docker rmi): build it again, once
                _IMAGE.clear()
            self._box = OSContainer(self._docker(), self._image(), **self.limits)
        for i, (lang, code) in enumerate(d["init"]):
            res = self._box.run_script(lang, code, timeout_s=self.script_timeout_s)
            if res.exit_code != 0:
                self._close_box()
                raise EnvError(f"{ENV}: init script {i + 1} of task {task.task_id!r} failed (exit {res.exit_code}"
                               f"{', timed out' if res.timed_out else ''}): {(res.stderr or res.stdout)[-300:]!r}")
        shell = self._box.shell()
        if d["start"] is not None:
            shell.run(str(d["start"][1]), timeout_s=self.script_timeout_s)  # typed into the shell, as AgentBench does
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": "Now, I will start a new problem in a new OS. My problem is:\n\n" + d["description"]},
        ]

    def close(self) -> None:
        self._close_box()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        super().close()

    # ------------------------------------------------------------------ tools
    @tool
    def bash_action(self, script: str) -> str:
        """Run bash code in your shell (cd, variables and background jobs persist between calls).

        Args:
            script: The bash code to run. It must not wait for input.

        Returns:
            "The output of the OS:" and what the terminal showed (cut to 800 characters), or "The output of the OS is empty."
        """
        return self._bash(script)

    @tool
    def answer_action(self, answer: str) -> str:
        """Give your answer to the question; this ends the episode.

        Args:
            answer: The exact answer (for example a single number).

        Returns:
            Whether the answer was accepted.
        """
        return self._commit(answer)

    @tool
    def finish_action(self) -> str:
        """Say that the requested operation is done (no answer); this ends the episode.

        Returns:
            Whether the task was accomplished.
        """
        return self._commit(None)

    def _bash(self, script: str) -> str:
        if self._box is None:
            raise ConfigurationError("no container: call reset() first")
        self.count("bash_actions")
        res = self._box.shell().run(script, timeout_s=self.command_timeout_s)
        if res.timed_out:
            self.count("command_timeouts")
        if res.restarted:
            self.count("shell_restarts")
        text = res.output
        if script == self._example_script():
            self._expert_output = text
        notes = []
        if res.timed_out:
            notes.append(f"[the command ran past {self.command_timeout_s:g} s: it got Ctrl-C"
                         + (" and was killed" if res.killed else "") + "]")
        if res.restarted:
            notes.append("[the shell exited and a new one was started: cd, variables and background jobs are gone]")
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars - 20] + "\n[truncated because the output is too long]"
        if notes:
            text = (text + ("\n" if text and not text.endswith("\n") else "") + "\n".join(notes)).strip("\n")
        return f"The output of the OS:\n\n{text}" if text else "The output of the OS is empty."

    def _commit(self, answer: Any) -> str:
        task = self._require_task()
        self.count("answers")
        box = self._box
        evaluation = task.data["evaluation"]

        def run(lang: str, code: str, params: list[str]) -> Any:
            assert box is not None
            return box.run_script(lang, code, params, timeout_s=self.script_timeout_s)

        guard: dict[str, Any] = {}
        if "check" in evaluation and box is not None:
            try:
                guard = box.seal()  # the agent's processes die; checks run on the image's code only
            except SandboxUnavailable:
                raise
            except SandboxError as e:  # the agent left a state no check can be trusted in
                self.count("checks_unsealed")
                self.last_check = {"answer": answer, "passed": False, "steps": [], "error": str(e)}
                self.finish(0.0, False)
                return "Incorrect. The episode is over."
        ok, steps = judge(evaluation, answer, run)
        self.last_check = {"answer": answer, "passed": ok, "steps": steps, **({"guard": guard} if guard else {})}
        self.finish(1.0 if ok else 0.0, ok)
        return ("Correct." if ok else "Incorrect.") + " The episode is over."

    def _require_task(self) -> TaskSpec:
        if self.task is None:
            raise ConfigurationError("no task: call reset() first")
        return self.task

    # ------------------------------------------------------------------ AgentBench's text protocol
    def _text_action(self, text: str) -> StepResult | None:
        act = parse_agentbench_text(text)
        if act is None:
            return None
        kind, content = act
        if kind == "bash":
            out = self._bash(content or "")
        elif kind == "answer":
            out = self._commit(content)
        else:
            out = self._commit(None)
        return StepResult([{"role": "user", "content": out}])

    def on_text(self, text: str) -> StepResult:
        return self._text_action(text) or super().on_text(text)

    def on_command(self, command: str) -> StepResult:
        return self._text_action(command) or super().on_command(command)

    # ------------------------------------------------------------------ expert
    def expert_action(self) -> Any:
        """Runs the task's example script and answers its output, or answers the match; else finishes."""
        if self.task is None or self.done:
            return None
        ev = self.task.data["evaluation"]
        if "match" in ev:
            if "answer" in ev["match"]:
                return format_call(self.parser.name, "answer_action", {"answer": ev["match"]["answer"]})
            return format_call(self.parser.name, "finish_action", {})
        script = self._example_script()
        if script is None:
            return format_call(self.parser.name, "finish_action", {})
        if self._expert_output is None:
            return format_call(self.parser.name, "bash_action", {"script": script})
        return format_call(self.parser.name, "answer_action", {"answer": self._expert_output.strip()})

    def _example_script(self) -> str | None:
        """The task's example script as a shell command (what the expert runs), if it has one."""
        example = self.task.data["evaluation"].get("example") if self.task is not None else None
        if example is None:
            return None
        lang, code = example
        return str(code) if lang == "bash" else f"python3 -c {shlex.quote(code)}"
