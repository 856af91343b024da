"""``agentgym/Bash-v0``: AgentBench-OS-style shell tasks in a sandbox.

Each task has an init script that prepares the sandbox's working directory, a question, and a
checker: an integer match, a string match, or a check script run inside the sandbox (exit 0 =
correct; the answer is its ``$1``). Tools: ``bash(cmd)`` runs a command and shows its output;
``answer(text)`` answers and ends the episode.

Files persist across ``bash`` calls within an episode (one sandbox session per episode, with
``/work`` as the working directory); every call is a fresh shell (``cd`` and variables do not
carry over) and no process survives a call. Episodes never share files.
"""

from __future__ import annotations

import random
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.core import AgentEnv
from agentgym.errors import ConfigurationError
from agentgym.sandbox import Sandbox, SandboxSession
from agentgym.tools import tool
from agentgym.types import Message, TaskSpec

from .env import format_call, make_sandbox

__all__ = ["BashEnv", "builtin_bash_tasks", "check_answer"]


# ----------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class _Made:
    init: str
    question: str
    check: dict[str, Any]
    expert: str  # the command the expert runs; its output (stripped) is its answer


def _q(s: str) -> str:
    return shlex.quote(s)


def _write(path: str, content: str) -> str:
    return f"mkdir -p {_q(path.rsplit('/', 1)[0]) if '/' in path else '.'} && printf '%s' {_q(content)} > {_q(path)}"


def _t_count_ext(r: random.Random) -> _Made:
    ext = r.choice(["log", "csv", "py", "md"])
    others = [e for e in ("txt", "json", "cfg") if e != ext]
    cmds, n = [], 0
    for i in range(r.randint(6, 14)):
        d = r.choice(["data", "data/a", "data/a/b", "data/c"])
        e = ext if r.random() < 0.5 else r.choice(others)
        n += e == ext
        cmds.append(_write(f"{d}/f{i}.{e}", f"file {i}\n"))
    return _Made("\n".join(cmds), f"How many files with the extension .{ext} are there under the directory data "
                 "(including subdirectories)?", {"type": "int", "answer": n},
                 f"find data -type f -name '*.{ext}' | wc -l")


def _t_grep_count(r: random.Random) -> _Made:
    word = r.choice(["ERROR", "WARN", "timeout"])
    lines, n = [], 0
    for i in range(r.randint(10, 30)):
        hit = r.random() < 0.35
        n += hit
        lines.append(f"2024-01-{i % 28 + 1:02d} {'request ' + word if hit else 'request ok'} id={r.randint(1, 999)}")
    return _Made(_write("logs/app.log", "\n".join(lines) + "\n"),
                 f"How many lines of logs/app.log contain the word {word}?", {"type": "int", "answer": n},
                 f"grep -c {_q(word)} logs/app.log")


def _t_sum_numbers(r: random.Random) -> _Made:
    xs = [r.randint(-50, 500) for _ in range(r.randint(5, 20))]
    return _Made(_write("numbers.txt", "\n".join(map(str, xs)) + "\n"),
                 "What is the sum of the integers in numbers.txt (one per line)?", {"type": "int", "answer": sum(xs)},
                 "awk '{s+=$1} END {print s}' numbers.txt")


def _t_top_scorer(r: random.Random) -> _Made:
    names = r.sample(["ada", "bob", "cyd", "dee", "eve", "fay", "gus", "hal", "ivy"], r.randint(4, 8))
    scores = r.sample(range(10, 100), len(names))
    rows = "name,score\n" + "".join(f"{n},{s}\n" for n, s in zip(names, scores, strict=False))
    best = names[scores.index(max(scores))]
    return _Made(_write("users.csv", rows), "users.csv lists names and scores. Which name has the highest score? "
                 "Answer with the name only.", {"type": "string", "answer": best},
                 "tail -n +2 users.csv | sort -t, -k2 -n -r | head -1 | cut -d, -f1")


def _t_line_count_file(r: random.Random) -> _Made:
    n = r.randint(3, 40)
    content = "".join(f"line {i}\n" for i in range(n))
    return _Made(_write("data.txt", content), "Create a file named result.txt that contains only the number of "
                 "lines in data.txt. Answer 'done' when finished.",
                 {"type": "script", "script": f'test "$(tr -d "[:space:]" < result.txt)" = "{n}"'},
                 "wc -l < data.txt > result.txt && echo done")


def _t_distinct_words(r: random.Random) -> _Made:
    vocab = ["apple", "pear", "fig", "kiwi", "lime", "plum", "date", "yuzu"]
    words = [r.choice(vocab) for _ in range(r.randint(5, 25))]
    return _Made(_write("words.txt", " ".join(words) + "\n"), "How many distinct words does words.txt contain?",
                 {"type": "int", "answer": len(set(words))}, "tr ' ' '\\n' < words.txt | grep -v '^$' | sort -u | wc -l")


def _t_largest_file(r: random.Random) -> _Made:
    sizes = r.sample(range(10, 3000), r.randint(3, 7))
    cmds = [_write(f"big/file{i}.bin", "x" * s) for i, s in enumerate(sizes)]
    best = f"file{sizes.index(max(sizes))}.bin"
    return _Made("\n".join(cmds), "Which file in the directory big is the largest? Answer with its file name only.",
                 {"type": "string", "answer": best}, "ls -S big | head -1")


def _t_rename(r: random.Random) -> _Made:
    n = r.randint(2, 6)
    cmds = [_write(f"docs/note{i}.txt", f"note {i}\n") for i in range(n)]
    cmds.append(_write("docs/keep.cfg", "x\n"))
    script = (f'test "$(ls docs/*.txt 2>/dev/null | wc -l)" = 0 && test "$(ls docs/*.md | wc -l)" = {n} '
              "&& test -f docs/keep.cfg")
    return _Made("\n".join(cmds), "Rename every .txt file in the directory docs to the same name with the extension "
                 ".md (leave other files alone). Answer 'done' when finished.", {"type": "script", "script": script},
                 "for f in docs/*.txt; do mv \"$f\" \"${f%.txt}.md\"; done; echo done")


def _t_config_value(r: random.Random) -> _Made:
    port = r.randint(1024, 65000)
    key = r.choice(["port", "timeout", "workers"])
    vals = {"port": port, "timeout": r.randint(1, 99), "workers": r.randint(1, 64)}
    ini = "[server]\n" + "".join(f"{k} = {v}\n" for k, v in vals.items()) + "[client]\nport = 1\n"
    return _Made(_write("config/app.ini", ini), f"What is the value of '{key}' in the [server] section of "
                 "config/app.ini?", {"type": "int", "answer": vals[key]},
                 f"awk -F' = ' '/^\\[/{{s=$0}} s==\"[server]\" && $1==\"{key}\" {{print $2}}' config/app.ini")


def _t_count_dirs(r: random.Random) -> _Made:
    dirs: set[str] = set()
    for _ in range(r.randint(2, 8)):
        parts = [r.choice("abc") for _ in range(r.randint(1, 3))]
        for k in range(1, len(parts) + 1):
            dirs.add("tree/" + "/".join(parts[:k]))
    return _Made("mkdir -p " + " ".join(sorted(dirs)), "How many directories are inside tree (at any depth, not "
                 "counting tree itself)?", {"type": "int", "answer": len(dirs)}, "find tree -mindepth 1 -type d | wc -l")


_TEMPLATES: list[tuple[str, Callable[[random.Random], _Made]]] = [
    ("count_ext", _t_count_ext), ("grep_count", _t_grep_count), ("sum_numbers", _t_sum_numbers),
    ("top_scorer", _t_top_scorer), ("line_count_file", _t_line_count_file), ("distinct_words", _t_distinct_words),
    ("largest_file", _t_largest_file), ("rename", _t_rename), ("config_value", _t_config_value),
    ("count_dirs", _t_count_dirs),
]


def builtin_bash_tasks(variants: int = 6, seed: int = 0) -> list[TaskSpec]:
    """10 task families x ``variants``; variants 0-3 are ``train``, the rest ``test``."""
    out = []
    for name, fn in _TEMPLATES:
        for v in range(variants):
            m = fn(random.Random(f"{seed}/{name}/{v}"))
            out.append(TaskSpec(f"bash/{name}/{v}", "train" if v % 3 != 2 else "test", name,
                                {"init": m.init, "question": m.question, "check": m.check, "expert": m.expert}))
    return out


def _strip_answer(text: str, expected: str) -> str:
    """``text`` without surrounding whitespace, quotes or backticks, or a sentence's final period.

    Leading dots stay (``.plain.log`` is a file name), and a final period stays when the expected
    answer ends with one.
    """
    prev = None
    while prev != text:
        prev = text
        text = text.strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"`":
            text = text[1:-1]
        if text.endswith(".") and not expected.endswith("."):
            text = text[:-1]
    return text


def check_answer(check: dict[str, Any], answer: str, run_script: Callable[[str], int] | None = None) -> bool:
    """Apply a task's checker to ``answer``; ``run_script`` runs a check script, returning its exit code."""
    kind = check.get("type")
    text = answer.strip()
    if kind == "int":
        m = re.search(r"-?\d+", text.replace(",", ""))
        return m is not None and int(m.group()) == int(check["answer"])
    if kind == "string":
        return _strip_answer(text, str(check["answer"]).strip()) == str(check["answer"]).strip()
    if kind == "script":
        if run_script is None:
            raise ConfigurationError("a script checker needs a sandbox session")
        return run_script(f"set -- {_q(text)}\n{check['script']}") == 0
    raise ConfigurationError(f"unknown checker type {kind!r} (int, string or script)")


# ----------------------------------------------------------------------------------- env
class BashEnv(AgentEnv):
    """AgentBench-OS-style shell tasks (see the module docstring).

    Args:
        tasks: A list of TaskSpec (data: init, question, check, expert); default: the built-in set.
        sandbox: Backend name (``"auto"``: bwrap, falling back to process) or a Sandbox.
        timeout_s: Wall-clock limit of each ``bash`` call.
        max_output_chars: How much command output the agent sees.
    """

    family = "code"

    def __init__(self, tasks: Sequence[TaskSpec] | None = None, sandbox: str | Sandbox = "auto",
                 timeout_s: float = 10.0, max_output_chars: int = 4000,
                 sandbox_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tasks = list(tasks) if tasks is not None else builtin_bash_tasks()
        self._sandbox_spec = sandbox
        self._sandbox_kwargs = dict(sandbox_kwargs or {})
        self._box: Sandbox | None = None
        self._session: SandboxSession | None = None
        self.timeout_s = float(timeout_s)
        self.max_output_chars = int(max_output_chars)
        self._expert_output: str | None = None

    @property
    def sandbox(self) -> Sandbox:
        if self._box is None:
            spec = self._sandbox_spec
            if spec == "auto":  # sessions run cold, so a plain bwrap sandbox is enough
                from agentgym.errors import SandboxUnavailable
                from agentgym.sandbox import get_sandbox

                try:
                    self._box = get_sandbox("bwrap", **self._sandbox_kwargs)
                except SandboxUnavailable:
                    self._box = get_sandbox("process")
            else:
                self._box = make_sandbox(spec, **self._sandbox_kwargs)
        return self._box

    def tasks(self, split: str = "train") -> Sequence[TaskSpec]:
        return [t for t in self._tasks if t.split == split]

    def system_prompt(self) -> str:
        return (
            "You are working in a Linux shell sandbox without network access; the current directory is "
            "your workspace and files persist between commands. Use the bash tool to run commands, then "
            "call answer with your final answer (this ends the episode). "
            + self.parser.format_instructions(self.tools)
        )

    def _close_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def reset_task(self, task: TaskSpec) -> list[Message]:
        self._close_session()
        self._session = self.sandbox.session()
        r = self._session.run(task.data["init"], language="bash", timeout_s=30)
        if not r.ok:
            from agentgym.errors import EnvError

            raise EnvError(f"init script of {task.task_id} failed: {r.summary(500)}")
        self._expert_output = None
        return [{"role": "system", "content": self.system_prompt()},
                {"role": "user", "content": task.data["question"]}]

    @tool
    def bash(self, cmd: str) -> str:
        """Run a bash command in the workspace and show its output.

        Args:
            cmd: The command (a fresh shell each time; files persist, ``cd`` does not).

        Returns:
            The command's stdout and stderr, and a note if it failed or timed out.
        """
        assert self._session is not None
        self.count("commands")
        r = self._session.run(cmd, language="bash", timeout_s=self.timeout_s,
                              max_output_bytes=max(self.max_output_chars * 4, 1 << 16))
        if self.task is not None and cmd == self.task.data.get("expert"):
            self._expert_output = r.stdout
        return r.summary(self.max_output_chars)

    @tool
    def answer(self, text: str) -> str:
        """Give your final answer; the episode ends.

        Args:
            text: The answer (a number, a name, or 'done' for tasks that change files).

        Returns:
            Whether the answer was correct.
        """
        assert self.task is not None and self._session is not None
        session = self._session

        def run_script(script: str) -> int:
            r = session.run(script, language="bash", timeout_s=30)
            return -1 if r.exit_code is None else r.exit_code

        ok = check_answer(self.task.data["check"], text, run_script)
        self.finish(float(ok), ok)
        return "Correct." if ok else "Wrong answer."

    def expert_action(self) -> str | Message | None:
        if self.task is None or self.done:
            return None
        if self._expert_output is None:
            return format_call(self.parser.name, "bash", {"cmd": self.task.data["expert"]})
        return format_call(self.parser.name, "answer", {"text": self._expert_output.strip()})

    def close(self) -> None:
        self._close_session()
        if self._box is not None and self._box is not self._sandbox_spec:
            self._box.close()
        self._box = None
        super().close()
