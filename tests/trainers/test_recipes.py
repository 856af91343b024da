"""The recipes (``agentgym.recipes``): installed and importable, one per kind of run, eval policies apart
from the rollout engines unless a config lends one, no side effects at import."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from agentgym.trainers.config import validate_config

from agentgym.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]


def _cfg(model: str, out: Path, **eval_: Any) -> Any:
    import tiny_lookup  # noqa: F401  (registers the env)

    return validate_config({
        "run": {"out_dir": str(out), "steps": 2, "seed": 0, "threads": 1},
        "model": {"path": model},
        "rollout": {"env": "agentgym/TinyLookup-v0", "group_size": 4, "groups_per_step": 2, "max_tokens": 6,
                    "max_turns": 2, "sampling_seeds": True},
        # zero-variance groups are replaced (up to 4 more rounds), so a step of this nearly greedy model still
        # trains: the assertions below need an update to have happened
        "filter": {"dynamic_sampling": True, "max_refill_rounds": 4},
        "optim": {"lr": 1e-2},
        "eval": {"split": "test", "tasks": 2, "before": False, "after": True, **eval_},
        "log": {"progress": False, "plot": False},
    })


def _service_policy(r: Any) -> Any:
    return r.runtime.flow.services["rollout-0"].handle.service.policies["policy"]


@pytest.mark.parametrize("share", [False, True])
def test_eval_policies_share_an_engine_only_when_the_config_says_so(tiny_sft_model: str, tmp_path: Path,
                                                                   share: bool) -> None:
    from agentgym.recipes.rl import RLRecipe

    r = RLRecipe(_cfg(tiny_sft_model, tmp_path, share_rollout_engine=share))
    seen: list[Any] = []
    r.on_step = lambda rec: seen.append(_service_policy(r))
    try:
        r.setup()
        res = r.train()
        evaluated = r.eval_policies["policy"]
    finally:
        r.cleanup()
    served = seen[-1]
    assert (served is evaluated) == share  # by default the held-out eval never runs on a training engine
    # either way the held-out evaluation saw the trained weights, at the version the services hold
    assert res["after"]["version"] == r.version == evaluated.weight_version >= 1
    ev, sv = evaluated.state_dict(), served.state_dict()
    assert all(torch.equal(ev[k], sv[k]) for k in sv)
    if not share:  # and not the initial ones
        from safetensors.torch import load_file

        init = load_file(str(Path(tiny_sft_model) / "model.safetensors"))
        assert any(not torch.equal(init[k], ev[k]) for k in init if k in ev)


def test_sharing_needs_an_rl_run_on_the_embedded_runtime() -> None:
    with pytest.raises(ConfigurationError, match="share_rollout_engine"):
        validate_config({"run": {"algorithm": "sft"}, "data": {"paths": ["x"]}, "eval": {"share_rollout_engine": True}})
    with pytest.raises(ConfigurationError, match="share_rollout_engine"):
        validate_config({"dataflow": {"runtime": "ray"}, "eval": {"share_rollout_engine": True}})


def test_recipes_import_without_side_effects() -> None:
    """Importing the library and the recipes registers no fork hook (a run registers it when it takes its
    folder's lock); the installed package serves the repository's recipes."""
    code = ("import json, agentgym.recipes, agentgym.recipes.rl, agentgym.recipes.sft, agentgym.trainers.run as run; "
            "before = run._AT_FORK_REGISTERED; import tempfile; f = run.RunFolder(tempfile.mkdtemp()).lock(); "
            "print(json.dumps([before, run._AT_FORK_REGISTERED, agentgym.recipes.__file__])); f.release()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after, where = json.loads(out.stdout)
    assert (before, after) == (False, True)
    assert Path(where).resolve() == (ROOT / "recipes" / "__init__.py").resolve()
    for path in [*(ROOT / "trainers").glob("*.py"), *(ROOT / "recipes").glob("*.py")]:
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
        assert not any("register_at_fork" in ast.unparse(n) for n in top), path


def test_one_recipe_per_kind_of_run_no_algorithm_branches() -> None:
    """SFT and RL are two recipes; GRPO, Dr.GRPO, RLOO and DAPO are config of the RL one: neither recipe
    branches on ``run.algorithm`` (only ``agentgym.recipes.recipe_for`` picks the recipe)."""
    from agentgym.recipes import recipe_for
    from agentgym.recipes.rl import RLRecipe
    from agentgym.recipes.sft import SFTRecipe

    for name in ("sft.py", "rl.py", "components.py"):
        assert "algorithm ==" not in (ROOT / "recipes" / name).read_text(), name
    assert isinstance(recipe_for(validate_config({"run": {"algorithm": "sft"}, "data": {"paths": ["x"]}})), SFTRecipe)
    for est in ("grpo", "dr_grpo", "rloo"):
        assert isinstance(recipe_for(validate_config({"advantage": {"estimator": est}})), RLRecipe)
