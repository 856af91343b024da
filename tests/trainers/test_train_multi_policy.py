"""Two policies trained at once: each has its own optimizer and sees only its own tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from agentgym.trainers.batching import TrainSample
from agentgym.trainers.config import OptimConfig, validate_config
from agentgym.trainers.model import add_lora, load_causal_lm
from agentgym.trainers.trainer import PolicyTrainer


def _samples(tok: Any, pid: str, answer: str) -> list[TrainSample]:
    head = tok("<|im_start|>user\nkey[owl]<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    body = tok(f"answer[{answer}]<|im_end|>", add_special_tokens=False)["input_ids"]
    return [TrainSample(pid, head + body, [0] * len(head) + [1] * len(body), adv) for adv in (1.0, -0.5)]


def _snapshot(model: Any, needle: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if needle in n}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _shared(tiny_model: str) -> tuple[Any, PolicyTrainer, PolicyTrainer]:
    torch.manual_seed(0)
    model = load_causal_lm(tiny_model)
    for pid in ("solver", "verifier"):
        model = add_lora(model, pid, rank=4, alpha=8, dropout=0.0, targets="all-linear")
    a = PolicyTrainer("solver", model, optim=OptimConfig(lr=1e-2), adapter="solver")
    b = PolicyTrainer("verifier", model, optim=OptimConfig(lr=1e-2), adapter="verifier")
    return model, a, b


def test_two_lora_adapters_over_one_base_are_isolated(tiny_model: str, tiny_tokenizer: Any) -> None:
    model, a, b = _shared(tiny_model)
    assert {id(p) for _, p in a.params}.isdisjoint({id(p) for _, p in b.params})
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    b_before, a_before = _snapshot(model, ".verifier."), _snapshot(model, ".solver.")
    # A's batch also contains B's samples: A must train on its own tokens only
    mixed = _samples(tiny_tokenizer, "solver", "red") + _samples(tiny_tokenizer, "verifier", "tan")
    m = a.train_on(mixed)
    assert m["sequences"] == 2 and m["optimizer_steps"] == 1
    assert _equal(_snapshot(model, ".verifier."), b_before)  # B untouched
    assert not _equal(_snapshot(model, ".solver."), a_before)  # A moved
    assert _equal({n: p.detach() for n, p in model.named_parameters() if "lora_" not in n}, base)  # base frozen
    assert b.optimizer.state == {} or all(not s for s in b.optimizer.state.values())
    # the same step on A's samples alone gives exactly the same weights: B's tokens had no effect
    model2, a2, _ = _shared(tiny_model)
    a2.train_on(_samples(tiny_tokenizer, "solver", "red"))
    assert _equal(_snapshot(model2, ".solver."), _snapshot(model, ".solver."))
    # and B's step leaves A alone
    a_after = _snapshot(model, ".solver.")
    b.train_on(mixed)
    assert _equal(_snapshot(model, ".solver."), a_after)
    assert not _equal(_snapshot(model, ".verifier."), b_before)


def test_two_separate_models_are_isolated(tiny_model: str, tiny_tokenizer: Any) -> None:
    ma, mb = load_causal_lm(tiny_model), load_causal_lm(tiny_model)
    a = PolicyTrainer("solver", ma, optim=OptimConfig(lr=1e-2))
    b = PolicyTrainer("verifier", mb, optim=OptimConfig(lr=1e-2))
    b_before = _snapshot(mb, "")
    a.train_on(_samples(tiny_tokenizer, "solver", "red") + _samples(tiny_tokenizer, "verifier", "tan"))
    assert _equal(_snapshot(mb, ""), b_before)
    assert b.steps == 0 and a.steps == 1


def _multi_cfg(model: str, out: Path, shared: bool = True, **multi: Any) -> Any:
    import tiny_lookup  # noqa: F401  (registers the env)

    return validate_config({
        "run": {"out_dir": str(out), "steps": 2, "seed": 0, "checkpoint_every": 1, "threads": 1},
        "model": {"path": model, "finetune": "lora", "lora_rank": 4},
        "multi": {"workflow": "solver_verifier", "shared_base": shared, "verifier_max_tokens": 6, **multi},
        "rollout": {"env": "agentgym/TinyLookup-v0", "group_size": 4, "groups_per_step": 3, "max_tokens": 8,
                    "max_turns": 2, "sampling_seeds": True},
        "filter": {"dynamic_sampling": False},
        "optim": {"lr": 1e-2},
        "eval": {"before": False, "after": False},
        "log": {"progress": False, "plot": False},
    })


def _lora(r: Any, pid: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in r.trainers[pid].params}


def _trained_tokens(ids: list[int], mask: list[int]) -> tuple[int, ...]:
    return tuple(t for t, m in zip(ids, mask, strict=True) if m)


class _Spy:
    """Records what each trainer was handed and every batch the recipe pulled (wrapping, not replacing)."""

    def __init__(self, r: Any) -> None:
        self.samples: dict[str, list[TrainSample]] = {pid: [] for pid in r.trainers}
        self.trajectories: list[Any] = []
        for pid, tr in r.trainers.items():
            real = tr.train_on

            def train_on(samples: list[TrainSample], real: Any = real, pid: str = pid) -> dict[str, Any]:
                self.samples[pid] += list(samples)
                return real(samples)  # type: ignore[no-any-return]

            tr.train_on = train_on
        real_batch = r.runtime.get_batch

        async def get_batch(pid: str, *a: Any, **kw: Any) -> Any:
            b = await real_batch(pid, *a, **kw)
            self.trajectories += [t for g in b.all_groups for t in g]
            return b

        r.runtime.get_batch = get_batch


def test_solver_verifier_recipe_trains_both(tiny_sft_model: str, tmp_path: Path) -> None:
    """The whole path: rollouts of two HF policies on one workflow, per-policy samples and rewards,
    two adapters over one base. Both adapters move, each only from its own generated tokens; the
    shared base stays frozen; both are published with the same, advancing version."""
    from agentgym.recipes.rl import RLRecipe

    cfg = _multi_cfg(tiny_sft_model, tmp_path / "run")  # the SFT model succeeds sometimes: both policies get signal
    steps: list[dict[str, Any]] = []
    r = RLRecipe(cfg, on_step=steps.append)
    try:
        r.setup()
        model = r.trainers["solver"].model
        base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
        before = {pid: _lora(r, pid) for pid in r.trainers}
        spy = _Spy(r)
        r.train()
        after = {pid: _lora(r, pid) for pid in r.trainers}
        assert _equal({n: p.detach() for n, p in model.named_parameters() if "lora_" not in n}, base)
    finally:
        r.cleanup()
    assert len(steps) == 2
    for rec in steps:
        assert rec["solver/rollout/episodes"] == rec["verifier/rollout/episodes"] == 12
    # both trained: optimizer steps taken, weights moved, versions advanced with each update
    for pid in ("solver", "verifier"):
        assert r.trainers[pid].steps >= 1, pid
        assert sum(rec[f"{pid}/train/optimizer_steps"] for rec in steps) == r.trainers[pid].steps
        assert not _equal(after[pid], before[pid]), f"{pid}'s adapter did not change"
    # a version per step that updated anything, and both policies' weights reached the rollout service with it
    updated = [any(rec[f"{pid}/train/optimizer_steps"] for pid in ("solver", "verifier")) for rec in steps]
    assert [rec["version"] for rec in steps] == [sum(updated[: k + 1]) for k in range(len(steps))]
    assert r.version == sum(updated) >= 1
    for rec, up in zip(steps, updated, strict=True):
        if up:
            assert rec["publish/solver/services/rollout-0"] == rec["publish/verifier/services/rollout-0"] == "ok"
            assert rec["publish/solver/version"] == rec["publish/verifier/version"] == rec["version"]
    # each only on its own tokens: what a trainer was handed is its policy's samples, and the tokens it
    # trained are exactly its own completions in some episode, never the other policy's
    own = {pid: {tuple(tok for tu in t.turns if tu.policy_id == pid for tok in tu.completion_token_ids)
                 for t in spy.trajectories} for pid in ("solver", "verifier")}
    for pid, other in (("solver", "verifier"), ("verifier", "solver")):
        handed = spy.samples[pid]
        assert handed and all(s.policy_id == pid for s in handed)
        trained = {_trained_tokens(s.token_ids, s.loss_mask) for s in handed}
        assert trained <= own[pid]
        assert not trained & (own[other] - own[pid])
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1]
    assert (tmp_path / "run" / "final" / "solver" / "adapter").is_dir()


@pytest.mark.parametrize("shared", [True, False])
def test_alternating_schedule_trains_one_policy_per_step(tiny_sft_model: str, tmp_path: Path, shared: bool) -> None:
    """The alternating baseline: step k trains only policy k mod 2, and the policy a step leaves out keeps
    its weights exactly; concurrent separate models train in threads."""
    from agentgym.recipes.rl import RLRecipe

    cfg = _multi_cfg(tiny_sft_model, tmp_path / "run", shared=shared, schedule="alternating")
    cfg.run.steps = 4  # each policy gets two steps: a step whose groups all tied trains nothing (checked too)
    steps: list[dict[str, Any]] = []
    weights: list[dict[str, dict[str, torch.Tensor]]] = []
    r = RLRecipe(cfg, on_step=lambda rec: (steps.append(rec), weights.append({p: _lora(r, p) for p in r.trainers})))
    try:
        r.setup()
        weights.append({p: _lora(r, p) for p in r.trainers})
        r.train()
    finally:
        r.cleanup()
    assert [("solver/train/optimizer_steps" in s, "verifier/train/optimizer_steps" in s) for s in steps] == [
        (True, False), (False, True)] * 2
    for k, rec in enumerate(steps):
        pid, idle = ("solver", "verifier") if k % 2 == 0 else ("verifier", "solver")
        assert _equal(weights[k + 1][idle], weights[k][idle])  # the policy the step left out kept its weights
        moved = not _equal(weights[k + 1][pid], weights[k][pid])
        assert moved == (rec[f"{pid}/train/optimizer_steps"] == 1), rec  # the trained one moved iff it updated
    for pid in ("solver", "verifier"):
        assert r.trainers[pid].steps >= 1, f"{pid} never had a group with signal: change the seed"
    assert r.version == r.trainers["solver"].steps + r.trainers["verifier"].steps


def test_alternating_kept_trains_each_policy_on_every_rollout(tiny_sft_model: str, tmp_path: Path) -> None:
    """``alternating_kept``: step k trains policy k mod 2 on its batches of steps k-1 and k, so over the run each
    policy trains on every rollout batch but the last one the other policy took (none is dropped)."""
    from agentgym.recipes.rl import RLRecipe

    cfg = _multi_cfg(tiny_sft_model, tmp_path / "run", shared=True, schedule="alternating_kept")
    cfg.run.steps = 4
    steps: list[dict[str, Any]] = []
    r = RLRecipe(cfg, on_step=steps.append)
    try:
        r.setup()
        r.train()
    finally:
        r.cleanup()
    g = cfg.rollout.groups_per_step
    trained = [[(pid, rec[f"{pid}/dataflow/groups"]) for pid in ("solver", "verifier") if f"{pid}/train/optimizer_steps" in rec]
               for rec in steps]
    # step 0: the solver on batch 0; step 1: the verifier on batches 0 and 1; step 2: the solver on 1 and 2; ...
    assert trained == [[("solver", g)], [("verifier", 2 * g)], [("solver", 2 * g)], [("verifier", 2 * g)]]
    assert r._kept.keys() == {"solver"}  # batch 3's solver half awaits a step the run does not take


def test_merge_batches_keeps_groups_weights_and_counters() -> None:
    from agentgym.recipes.rl import merge_batches

    from agentgym.dataflow.flow import Batch

    a = Batch("p", ["g1"], ["t1"], replayed=["r1"], versions=[0], expired=1, wait_s=1.0, filtered=2)  # type: ignore[list-item]
    b = Batch("p", ["g2", "g3"], ["t2", "t3"], replayed=["r2"], versions=[1, 1], replay_weights=[0.5], short=True)  # type: ignore[list-item]
    m = merge_batches(a, b)
    assert m.all_groups == ["g1", "g2", "g3", "r1", "r2"]
    assert m.group_weights == [1.0, 1.0, 1.0, 1.0, 0.5]
    assert (m.tickets, m.versions, m.expired, m.wait_s, m.filtered, m.short) == (["t1", "t2", "t3"], [0, 1, 1], 1, 1.0, 2, True)
    with pytest.raises(ValueError, match="cannot merge"):
        merge_batches(a, Batch("q", [], []))


@pytest.mark.parametrize("shared", [True, False])
def test_multi_config_builds(tiny_model: str, tmp_path: Path, shared: bool) -> None:
    from agentgym.trainers.run import policy_paths
    from agentgym.trainers.trainer import build_trainers

    cfg = validate_config({"run": {"out_dir": str(tmp_path)}, "model": {"path": tiny_model, "finetune": "lora"},
                           "multi": {"workflow": "solver_verifier", "shared_base": shared},
                           "eval": {"before": False, "after": False}})
    trainers = build_trainers(cfg.model, policy_paths(cfg.model, cfg.multi), algorithm="grpo", optim=cfg.optim,
                              loss=cfg.loss, batches={"solver": 1, "verifier": 1}, shared_base=cfg.multi.shared_base)
    a, b = trainers["solver"], trainers["verifier"]
    assert (a.model is b.model) == shared
    assert a.optimizer is not b.optimizer
