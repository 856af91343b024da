"""DESIGN.md's dependency rules, checked by reading the source (not by importing it).

Every ``import`` and ``from ... import`` statement is read with :mod:`ast`: module level, inside
functions (local imports) and inside ``if TYPE_CHECKING:`` blocks, plus ``importlib.import_module``
and ``__import__`` calls whose argument is a string literal. Files map to modules as installed
(``agentgym/`` -> ``agentgym``, ``envs/`` -> ``agentgym.envs``, ``policies/`` -> ``agentgym.policies``,
``trainers/`` -> ``agentgym.trainers``, ``recipes/`` -> ``recipes`` or ``agentgym.recipes``). An import
names the most specific module it loads: ``from agentgym.eval import runner`` is an edge to
``agentgym.eval.runner``, ``from agentgym.eval import EvalConfig`` one to the package ``agentgym.eval``.

How the kinds of import count:

* **Layer rules** count every import, ``TYPE_CHECKING`` ones included: a type named in an annotation
  is still a dependency on the layer that defines it.
* **Cycles** count every import that executes, local ones included (a function-local import only
  hides a cycle until the function runs); ``TYPE_CHECKING`` imports never execute, so they are the
  one sanctioned way for an annotation to name a type of a module that imports this one, and they
  are left out of the cycle graph.

Two parts: the rules themselves (a planted violation and a planted cycle in a synthetic tree must be
reported), and the real tree, whose findings must equal :data:`KNOWN_VIOLATIONS` exactly.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# folder (relative to the repository root) -> the import path it installs as
FOLDERS: dict[str, str] = {
    "agentgym": "agentgym",
    "envs": "agentgym.envs",
    "policies": "agentgym.policies",
    "trainers": "agentgym.trainers",
    "recipes": "recipes",
}

# Layers, most specific prefix first. Everything else under ``agentgym`` is the core.
LAYERS: list[tuple[str, str]] = [
    ("agentgym.cli", "cli"),
    ("agentgym.__main__", "cli"),
    ("agentgym.integrations", "edge"),
    ("agentgym.recipes", "recipes"),
    ("recipes", "recipes"),
    ("agentgym.envs", "envs"),
    ("agentgym.policies", "policies"),
    ("agentgym.trainers", "trainers"),
    ("agentgym", "core"),
]

# layer -> the layers it must never import (DESIGN.md "Dependency rules").
FORBIDDEN_LAYERS: dict[str, dict[str, str]] = {
    "core": {"envs": "the core imports no env", "policies": "the core imports no policy",
             "trainers": "the core imports no trainer", "recipes": "only the CLI imports the recipes",
             "cli": "nothing below the CLI imports it", "edge": "nothing in the library imports an integration"},
    "envs": {"policies": "envs never import policies", "trainers": "envs never import trainers",
             "recipes": "only the CLI imports the recipes", "cli": "nothing below the CLI imports it",
             "edge": "nothing in the library imports an integration"},
    "policies": {"envs": "policies never import envs", "trainers": "policies never import trainers",
                 "recipes": "only the CLI imports the recipes", "cli": "nothing below the CLI imports it",
                 "edge": "nothing in the library imports an integration"},
    "trainers": {"envs": "trainers see trajectories, never envs", "recipes": "only the CLI imports the recipes",
                 "cli": "nothing below the CLI imports it", "edge": "nothing in the library imports an integration"},
    "recipes": {"cli": "nothing below the CLI imports it", "edge": "nothing in the library imports an integration"},
    # adapters for other libraries (TRL, the Agents SDK, verifiers) sit at the edge beside the CLI: they may
    # build policies and envs, and nothing but the CLI may import them
    "edge": {"cli": "nothing below the CLI imports it", "recipes": "only the CLI imports the recipes"},
    "cli": {},
}

# Module prefixes a layer must never import, beyond the layer rules.
FORBIDDEN_MODULES: dict[str, dict[str, str]] = {
    "policies": {"agentgym.dataflow": "policies never import agentgym.dataflow (the weight types live in the core)"},
}

# Violations tolerated for now (none): the real-tree test fails on anything not listed here AND on any
# entry that no longer exists, so an entry goes in the same change that fixes it.
KNOWN_VIOLATIONS: set[str] = set()


@dataclass(frozen=True)
class Edge:
    """One import: ``importer`` loads ``imported`` (both module names) at ``path:line``."""

    importer: str
    imported: str
    path: str
    line: int
    local: bool  # inside a function
    type_checking: bool  # inside ``if TYPE_CHECKING:``

    def where(self) -> str:
        kind = " (local)" if self.local else " (TYPE_CHECKING)" if self.type_checking else ""
        return f"{self.path}:{self.line}{kind}"


def discover(root: Path, folders: dict[str, str] = FOLDERS) -> dict[str, Path]:
    """Every module under ``root``'s mapped folders: ``{module name: file}`` (packages by their ``__init__``)."""
    out: dict[str, Path] = {}
    for folder, prefix in folders.items():
        base = root / folder
        if not base.is_dir():
            continue
        for f in sorted(base.rglob("*.py")):
            rel = f.relative_to(base).with_suffix("").parts
            if "__pycache__" in rel or any(not p.isidentifier() for p in rel):
                continue
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join((prefix, *rel))] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _raw_imports(tree: ast.AST) -> Iterator[tuple[ast.AST, str, list[str], int, bool, bool]]:
    """``(node, module, names, level, local, type_checking)`` for every import in ``tree``."""

    def walk(nodes: Iterable[ast.AST], local: bool, tc: bool) -> Iterator[tuple[ast.AST, str, list[str], int, bool, bool]]:
        for node in nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield node, a.name, [], 0, local, tc
            elif isinstance(node, ast.ImportFrom):
                yield node, node.module or "", [a.name for a in node.names], node.level, local, tc
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)
                  and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                       or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
                yield node, node.args[0].value, [], 0, local, tc
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk([node.test], local, tc)
                yield from walk(node.body, local, True)
                yield from walk(node.orelse, local, tc)
                continue
            inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from walk(ast.iter_child_nodes(node), inner, tc)

    yield from walk([tree], False, False)


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The most specific known module that importing ``name`` loads (``None``: not ours)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in modules:
            return cand
    return None


def import_edges(modules: dict[str, Path], root: Path) -> list[Edge]:
    """Every import between our modules."""
    edges: list[Edge] = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        rel = str(path.relative_to(root))
        for node, name, names, level, local, tc in _raw_imports(tree):
            if level:
                base = package.split(".")
                base = base[: len(base) - (level - 1)] if level > 1 else base
                name = ".".join([*base, name] if name else base)
            targets = [f"{name}.{n}" for n in names if n != "*"] if names else [name]
            seen: set[str] = set()
            for t in targets:
                resolved = _resolve(t, modules)
                if resolved is None and names:
                    resolved = _resolve(name, modules)
                if resolved is None or resolved == mod or resolved in seen:
                    continue
                seen.add(resolved)
                edges.append(Edge(mod, resolved, rel, getattr(node, "lineno", 0), local, tc))
    return edges


def layer_of(module: str) -> str | None:
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def rule_violations(edges: list[Edge]) -> dict[str, list[str]]:
    """``{"importer -> imported": [why, where...]}`` for every import against the layer rules."""
    out: dict[str, list[str]] = {}
    for e in edges:
        src, dst = layer_of(e.importer), layer_of(e.imported)
        if src is None or dst is None:
            continue
        why = FORBIDDEN_LAYERS.get(src, {}).get(dst) if src != dst else None
        for prefix, reason in FORBIDDEN_MODULES.get(src, {}).items():
            if e.imported == prefix or e.imported.startswith(prefix + "."):
                why = reason
        if why is not None:
            out.setdefault(f"{e.importer} -> {e.imported}", [why]).append(e.where())
    return out


def import_cycles(edges: list[Edge]) -> dict[str, list[str]]:
    """``{"cycle: a <-> b <-> c": [the edges inside it]}``: one entry per strongly connected component
    (of two or more modules) of the graph of imports that execute."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if not e.type_checking:
            graph.setdefault(e.importer, set()).add(e.imported)
            graph.setdefault(e.imported, set())
    # Tarjan's algorithm, iterative (deep import chains must not hit the recursion limit).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
    out: dict[str, list[str]] = {}
    for comp in comps:
        members = set(comp)
        inside = sorted(f"{e.importer} -> {e.imported} at {e.where()}" for e in edges
                        if not e.type_checking and e.importer in members and e.imported in members)
        out["cycle: " + " <-> ".join(comp)] = inside
    return out


def findings(root: Path) -> dict[str, list[str]]:
    edges = import_edges(discover(root), root)
    return {**rule_violations(edges), **import_cycles(edges)}


def _format(found: dict[str, list[str]], keys: set[str]) -> str:
    return "\n".join(f"  {k}: {'; '.join(found.get(k, []))}" for k in sorted(keys))


# ---------------------------------------------------------------------------------------------- the rules


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp


CLEAN = {
    "agentgym/__init__.py": "from agentgym.core import AgentEnv\n",
    "agentgym/core.py": "import gymnasium\nfrom agentgym import errors\n",
    "agentgym/errors.py": "",
    "agentgym/dataflow/__init__.py": "",
    "agentgym/dataflow/flow.py": "from agentgym.core import AgentEnv\n",
    "agentgym/cli/__init__.py": "def train():\n    from agentgym.trainers import trainer\n    import agentgym.envs.demo\n",
    "envs/__init__.py": "",
    "envs/demo/__init__.py": "from agentgym.core import AgentEnv\nfrom . import tasks\n",
    "envs/demo/tasks.py": "from ..demo import __name__ as _n\n",
    "policies/__init__.py": "from agentgym import errors\n",
    "trainers/__init__.py": "",
    "trainers/trainer.py": "from agentgym.dataflow import flow\nfrom agentgym.policies import errors\n",
}


def test_the_clean_synthetic_tree_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path, CLEAN)
    edges = import_edges(discover(root), root)
    assert {(e.importer, e.imported) for e in edges} >= {
        ("agentgym.cli", "agentgym.trainers.trainer"), ("agentgym.cli", "agentgym.envs.demo"),
        ("agentgym.envs.demo", "agentgym.envs.demo.tasks"), ("agentgym.trainers.trainer", "agentgym.dataflow.flow"),
        ("agentgym.core", "agentgym.errors")}
    # envs/demo/tasks.py imports its own package relatively: a cycle demo <-> demo.tasks
    assert set(findings(root)) == {"cycle: agentgym.envs.demo <-> agentgym.envs.demo.tasks"}


@pytest.mark.parametrize(("rel", "source", "expected"), [
    ("agentgym/rollout.py", "from agentgym.trainers.trainer import Trainer\n",
     "agentgym.rollout -> agentgym.trainers.trainer"),
    ("agentgym/sandbox.py", "def run():\n    import agentgym.envs.demo\n", "agentgym.sandbox -> agentgym.envs.demo"),
    ("agentgym/types.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agentgym.policies import P\n",
     "agentgym.types -> agentgym.policies"),
    ("envs/sql.py", "from agentgym.policies import errors\n", "agentgym.envs.sql -> agentgym.policies"),
    ("envs/sql.py", "import importlib\nimportlib.import_module('agentgym.trainers.trainer')\n",
     "agentgym.envs.sql -> agentgym.trainers.trainer"),
    ("policies/vllm.py", "from agentgym.dataflow.flow import X\n", "agentgym.policies.vllm -> agentgym.dataflow.flow"),
    ("policies/hf.py", "from ..envs import demo\n", "agentgym.policies.hf -> agentgym.envs.demo"),
    ("trainers/sft.py", "from agentgym.envs.demo import tasks\n", "agentgym.trainers.sft -> agentgym.envs.demo.tasks"),
    ("agentgym/eval.py", "from agentgym.cli import app\n", "agentgym.eval -> agentgym.cli"),
])
def test_a_planted_violation_is_reported(tmp_path: Path, rel: str, source: str, expected: str) -> None:
    root = _tree(tmp_path, {**CLEAN, "envs/demo/tasks.py": "", rel: source})
    found = findings(root)
    assert set(found) == {expected}, found
    assert found[expected][1].startswith(rel + ":")  # names the file and line


def test_a_planted_cycle_through_a_local_import_is_reported(tmp_path: Path) -> None:
    root = _tree(tmp_path, {**CLEAN, "envs/demo/tasks.py": "",
                            "agentgym/dataflow/runtime.py": "def make():\n    from agentgym.dataflow import ray_runtime\n",
                            "agentgym/dataflow/ray_runtime.py": "from agentgym.dataflow.runtime import make\n"})
    found = findings(root)
    assert set(found) == {"cycle: agentgym.dataflow.ray_runtime <-> agentgym.dataflow.runtime"}
    assert any("(local)" in e for e in found["cycle: agentgym.dataflow.ray_runtime <-> agentgym.dataflow.runtime"])


def test_type_checking_imports_count_for_layers_not_for_cycles(tmp_path: Path) -> None:
    root = _tree(tmp_path, {**CLEAN, "envs/demo/tasks.py": "",
                            "agentgym/a.py": "from agentgym import b\n",
                            "agentgym/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agentgym import a\n"})
    assert findings(root) == {}


# ---------------------------------------------------------------------------------------------- the real tree


def test_the_tree_follows_the_dependency_rules() -> None:
    modules = discover(ROOT)
    assert {"agentgym.core", "agentgym.envs.demo", "agentgym.policies", "agentgym.trainers"} <= set(modules)
    found = findings(ROOT)
    new = set(found) - KNOWN_VIOLATIONS
    gone = KNOWN_VIOLATIONS - set(found)
    assert not new, "imports against DESIGN.md's dependency rules:\n" + _format(found, new)
    assert not gone, ("fixed, so delete from KNOWN_VIOLATIONS in tests/core/test_import_rules.py:\n"
                      + "\n".join(f"  {k}" for k in sorted(gone)))


def test_core_packages_import_no_heavy_backend() -> None:
    """Heavy third-party backends load lazily: importing the core packages (and the eval CLI) loads none."""
    code = ("import sys, json, agentgym, agentgym.rollout, agentgym.eval, agentgym.cli.eval, agentgym.dataflow.flow, "
            "agentgym.dataflow.service; print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    heavy = ("torch", "transformers", "matplotlib", "vllm", "ray", "peft", "docker")
    assert [m for m in json.loads(out.stdout) if m.split(".")[0] in heavy] == []


def test_the_public_surface_is_small_and_lazy() -> None:
    """Every name in ``agentgym.__all__`` resolves; the checker (and plugins) load only when asked for."""
    code = ("import sys, json, agentgym\n"
            "before = sorted(m for m in sys.modules if m.startswith('agentgym'))\n"
            "missing = [n for n in agentgym.__all__ if getattr(agentgym, n, None) is None]\n"
            "print(json.dumps([before, missing, sorted(set(agentgym.__all__) - set(dir(agentgym)))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, missing, undirred = json.loads(out.stdout)
    assert missing == [] and undirred == []
    assert "agentgym.checker" not in before and "agentgym.eval" not in before
    assert set(before) <= {"agentgym", "agentgym.core", "agentgym.errors", "agentgym.loading", "agentgym.parsers",
                           "agentgym.registration", "agentgym.spaces", "agentgym.tools", "agentgym.types"}
