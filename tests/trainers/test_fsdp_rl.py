"""``torchrun --nproc_per_node 2 -m agentgym train`` with GRPO on the tiny model: the RL recipe, sharded.

Two gloo ranks on localhost (a free port, no network; bounded by a timeout, killed with their session whatever
happens). Rank 0 owns the rollout service (an ``HFPolicy`` on the TinyLookup tool task of ``test_learning.py``),
the eval policy, the logs and the checkpoint metadata; both ranks train on their share of each global
mini-batch, and both gather the new weights, which rank 0 publishes.

* GRPO learns to call the right tool (held-out success rises well above chance), and the same run with
  ``optim.lr = 0`` does not: the gain is the optimizer's.
* Rank 0 publishes what one process publishes: one version per step with an update (the first a full update,
  then sparse deltas), the same version numbers and update kinds as a one-process run of the same (LoRA) config,
  which also ends with the same trained weights; ``final/`` is a model folder transformers loads.
* The sharded checkpoint of step 2 resumes on two ranks and on one process, and both end where the
  uninterrupted run ended.
* A step in which rank 0 has no samples keeps the ranks in step (every group filtered: every rank calls
  ``train_on`` with nothing, no version is published, the run finishes).
* Two policies (``multi.workflow = "solver_verifier"``, separate models, each sharded over both ranks) train as
  one process trains them, with the ``concurrent`` (LoRA) and ``alternating_kept`` (full fine-tune) schedules:
  the same policies trained each step, the same versions published per policy, both policies' final weights
  equal; and a two-policy checkpoint (``alternating``) holds both policies' shards and resumes to the same end.

The equality of one sharded step with one process's step (two PPO mini-batches included) is
``test_fsdp.py``'s.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torchrun_launch import torchrun_train

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow

LEARN_STEPS = 12  # with 2 mini-batches a step, held-out success is at 100% by step 5




def _config(tmp: Path, model: str, out: Path, *, steps: int, lr: float, finetune: str = "full",
            extra: str = "", name: str = "rl", dynamic_sampling: bool = True) -> Path:
    cfg = f"""
[run]
out_dir = "{out}"
steps = {steps}
seed = 0
threads = 1
checkpoint_every = 2
keep_checkpoints = 3
[model]
path = "{model}"
finetune = "{finetune}"
lora_rank = 8
lora_alpha = 16.0
[rollout]
env = "agentgym/TinyLookup-v0"
imports = ["tiny_lookup"]
group_size = 8
groups_per_step = 8
max_tokens = 8
max_turns = 3
temperature = 1.0
concurrency = 64
sampling_seeds = true  # seeded rollouts (unseeded, one in several collapses at this lr); the same run every time only
# without dynamic sampling, whose refill groups race (which finish first depends on timing)
[advantage]
estimator = "grpo"
[loss]
tis_cap = 2.0
mini_batches = 2
[filter]
dynamic_sampling = {str(dynamic_sampling).lower()}
max_refill_rounds = 1
[optim]
lr = {lr}
grad_clip = 1.0
[eval]
split = "test"
temperature = 0.0
before = true
after = true
every = 0
[log]
plot = false
progress = false
[trainer]
strategy = "fsdp2"
{extra}
"""
    path = tmp / f"{name}.toml"
    path.write_text(cfg)
    return path


_torchrun = torchrun_train


def _rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _steps(folder: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's step records (the ones with a weight version), in order."""
    return [r for r in _rows(folder) if "version" in r]


def _publishes(folder: Path) -> list[tuple[int, int, str | None]]:
    """Per step: (step, version after it, kind of the update published in it or None)."""
    return [(int(r["step"]), int(r["version"]), r.get("publish/kind")) for r in _steps(folder)]


def _deliveries(folder: Path) -> list[str]:
    """How each published update reached the rollout service: ``ok`` (a delta applied on its base, checksums
    matching) or a fallback (``version_gap``, ``checksum_mismatch``: the whole state was resent)."""
    return [r["publish/services/rollout-0"] for r in _steps(folder) if "publish/services/rollout-0" in r]


def _final_weights(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder / "final"))
    return {n: p.detach().float() for n, p in model.named_parameters()}


def test_sharded_grpo_learns_and_zero_lr_does_not(tiny_sft_model: str, tmp_path: Path) -> None:
    """Without dynamic sampling the seeded run is the same every time (the same rewards step by step in repeated runs,
    loaded or not); with it, refill groups raced and one run in several ended at 0.0-0.5 held out."""
    learn = tmp_path / "learn"
    _, wall = _torchrun(_config(tmp_path, tiny_sft_model, learn, steps=LEARN_STEPS, lr=3e-3, name="learn",
                                dynamic_sampling=False))
    res = json.loads((learn / "result.json").read_text())
    before, after = res["before"]["success"], res["after"]["success"]
    print(f"sharded GRPO: held-out success {before:.2f} -> {after:.2f} in {wall:.0f} s")
    assert res["world_size"] == 2 and res["steps"] == LEARN_STEPS
    assert before < 0.3
    assert after > 0.8 and after - before > 0.5
    # rank 0 published as it trained: one version per step that updated, the first one whole, then deltas
    pubs = _publishes(learn)
    assert [s for s, _, _ in pubs] == list(range(LEARN_STEPS))
    updated = [r.get("train/optimizer_steps", 0) > 0 for r in _steps(learn)]
    assert [v for _, v, _ in pubs] == [sum(updated[:i + 1]) for i in range(len(updated))]
    kinds = [k for _, _, k in pubs if k is not None]
    assert len(kinds) == sum(updated) >= LEARN_STEPS // 2
    assert kinds[0] == "full" and set(kinds[1:]) == {"delta"}
    assert _deliveries(learn) == ["ok"] * len(kinds)  # every delta applied on the service's weights
    # a full fine-tune: the first update goes whole from rank 0's gathered copy, every later one from the ranks' own
    # slice diffs (trainers.shard_delta), and the service applied each on its checksummed base
    sources = [r["publish/source"] for r in _steps(learn) if "publish/source" in r]
    assert sources == ["gathered copy"] + ["shard deltas"] * (len(kinds) - 1)
    assert all(r.get("train/optimizer_steps") in (0, 2) for r in _steps(learn))  # 2 global mini-batches a step
    assert res["after"]["version"] == pubs[-1][1]
    assert (learn / "checkpoints" / f"step-{LEARN_STEPS:06d}" / "policy.dcp").is_dir()
    _final_weights(learn)  # a model folder transformers loads

    frozen = tmp_path / "frozen"
    _, wall0 = _torchrun(_config(tmp_path, tiny_sft_model, frozen, steps=LEARN_STEPS, lr=0.0, name="frozen",
                                 dynamic_sampling=False))
    res0 = json.loads((frozen / "result.json").read_text())
    print(f"sharded GRPO at lr = 0: held-out success {res0['before']['success']:.2f} -> "
          f"{res0['after']['success']:.2f} in {wall0:.0f} s")
    assert res0["before"]["success"] < 0.3
    assert res0["after"]["success"] < 0.3  # the same sharded recipe without learning stays at chance


def test_sharded_lora_publishes_like_one_process_and_resumes(tiny_sft_model: str, tmp_path: Path) -> None:
    steps = 4
    sharded = tmp_path / "sharded"
    config = _config(tmp_path, tiny_sft_model, sharded, steps=steps, lr=1e-2, finetune="lora", name="lora")
    # rollouts reproducible row by row, so the one-process twin rolls out the same episodes
    overrides = ["rollout.sampling_seeds=true", "eval.every=2", "eval.tasks=4"]
    _torchrun(config, *overrides)
    res = json.loads((sharded / "result.json").read_text())
    assert res["world_size"] == 2 and res["steps"] == steps
    assert (sharded / "eval" / "step-000002").is_dir() and (sharded / "eval" / "after").is_dir()
    assert (sharded / "final" / "adapter").is_dir()
    ck = sharded / "checkpoints"
    assert json.loads((ck / "step-000002" / "state.json").read_text())["world_size"] == 2
    got = _final_weights(sharded)

    # one process on the same config: the same versions, the same kinds of update, the same trained weights
    single = tmp_path / "single"
    _one_process(config, single, overrides)
    assert _publishes(sharded) == _publishes(single)
    assert _publishes(sharded)[0][2] == "full"
    want = _final_weights(single)
    init = _final_weights_of_model(tiny_sft_model)
    assert set(got) == set(want)
    moved = max(float((want[n] - init[n]).abs().max()) for n in want)
    worst = max(float((got[n] - want[n]).abs().max()) for n in want)
    assert moved > 1e-3 and worst < 2e-3 * moved, (worst, moved)

    # 2 ranks -> 2 ranks: resume the step-2 checkpoint; the services start from its weights (version 2), the
    # run publishes the versions and ends with the weights of the uninterrupted run
    resumed = tmp_path / "resumed"
    shutil.copytree(sharded, resumed, ignore=shutil.ignore_patterns("final", "result.json", "step-000004", ".lock"))
    out, _ = _torchrun(config, *overrides, f"run.out_dir={resumed}")
    assert "resumed from" in out and "at step 2" in out
    assert _publishes(resumed) == _publishes(sharded)
    # the service started from the gathered checkpoint weights: the first delta after the resume applied on them
    assert _deliveries(resumed) == _deliveries(sharded) == ["ok"] * steps
    again = _final_weights(resumed)
    worst = max(float((again[n] - want[n]).abs().max()) for n in want)
    assert worst < 2e-3 * moved, (worst, moved)

    # 2 ranks -> 1 process: the sharded step-2 checkpoint resumes in one process too
    shrunk = tmp_path / "shrunk"
    shutil.copytree(sharded, shrunk, ignore=shutil.ignore_patterns("final", "result.json", "step-000004", ".lock"))
    _one_process(config, shrunk, overrides)
    # it resumed (a fresh start would have dropped the sharded checkpoint) and went on in the one-process format
    assert (shrunk / "checkpoints" / "step-000002" / "policy.dcp").is_dir()
    assert (shrunk / "checkpoints" / "step-000004" / "policy.weights.safetensors").is_file()
    again = _final_weights(shrunk)
    worst = max(float((again[n] - want[n]).abs().max()) for n in want)
    assert worst < 2e-3 * moved, (worst, moved)


def test_a_step_without_samples_keeps_the_ranks_in_step(tiny_model: str, tmp_path: Path) -> None:
    """The untrained tiny model never succeeds: every group has zero variance and is filtered, so rank 0 has no
    samples in any step; every rank still calls train_on (with nothing), none publishes, the run ends."""
    out = tmp_path / "empty"
    config = _config(tmp_path, tiny_model, out, steps=2, lr=1e-2, name="empty")
    _torchrun(config, "eval.before=false", "eval.after=false", "filter.max_refill_rounds=0", "rollout.group_size=2",
              "rollout.groups_per_step=2", timeout_s=300)
    res = json.loads((out / "result.json").read_text())
    assert res["steps"] == 2 and res["lr_schedule"]["policy"]["optimizer_steps"] == 0
    assert res["lr_schedule"]["policy"]["spent"] == 2 * 2  # each empty batch still spent its schedule positions
    assert [v for _, v, _ in _publishes(out)] == [0, 0]


# ---------------------------------------------------------------------- two policies (multi.workflow)
POLICIES = ("solver", "verifier")
# a small, seeded two-policy run: 4 groups of 4 a step, every group kept (each policy gets its own samples)
MULTI = ["rollout.group_size=4", "rollout.groups_per_step=4", "rollout.max_turns=2", "filter.dynamic_sampling=false",
         "eval.before=false", "eval.tasks=4"]


def _multi_config(tmp: Path, model: str, out: Path, *, schedule: str, finetune: str, steps: int = 4,
                  name: str = "multi") -> Path:
    extra = f"""
[multi]
workflow = "solver_verifier"
schedule = "{schedule}"
verifier_max_tokens = 6
"""
    return _config(tmp, model, out, steps=steps, lr=1e-2, finetune=finetune, extra=extra, name=name)


def _multi_steps(folder: Path) -> list[tuple[int, int, dict[str, tuple[int, str | None, int | None]]]]:
    """Per step: (step, version after it, {policy trained in it: (optimizer steps, kind and version of the update
    published for it in the step or None)})."""
    return [(int(r["step"]), int(r["version"]),
             {pid: (int(r[f"{pid}/train/optimizer_steps"]), r.get(f"publish/{pid}/kind"), r.get(f"publish/{pid}/version"))
              for pid in POLICIES if f"{pid}/train/optimizer_steps" in r})
            for r in _steps(folder)]


def _weights_at(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path))
    return {n: p.detach().float() for n, p in model.named_parameters()}


def _policy_finals(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """``final/<policy>/``: each policy's trained model (LoRA merged), a folder transformers loads."""
    return {pid: _weights_at(folder / "final" / pid) for pid in POLICIES}


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.parametrize(("schedule", "finetune", "kl"), [("concurrent", "lora", 0.0), ("alternating_kept", "full", 0.0),
                                                        ("alternating", "full", 0.5)])
def test_sharded_two_policies_train_like_one_process(tiny_model: str, tiny_sft_model: str, tmp_path: Path,
                                                     schedule: str, finetune: str, kl: float) -> None:
    """Solver and verifier as two sharded models on 2 ranks: the same steps (which policy trained, its optimizer
    steps), the same versions and update kinds published for each policy, and both policies' final weights equal
    to the one-process run of the same config (seeded rollouts), each having moved well beyond the tolerance.
    The LoRA case gives the verifier a base model of its own (``multi.verifier_path``), which its gathered copy
    must be built on; the ``alternating`` case trains with a KL term, against each policy's sharded reference."""
    sharded = tmp_path / "sharded"
    config = _multi_config(tmp_path, tiny_sft_model, sharded, schedule=schedule, finetune=finetune)
    bases = {"solver": tiny_sft_model, "verifier": tiny_sft_model}
    overrides = list(MULTI)
    if kl:
        overrides.append(f"loss.kl_coef={kl}")
    if finetune == "lora":
        bases["verifier"] = tiny_model
        overrides.append(f"multi.verifier_path={tiny_model}")
    _, wall = _torchrun(config, *overrides)
    res = json.loads((sharded / "result.json").read_text())
    assert res["world_size"] == 2 and res["steps"] == 4
    assert (sharded / "eval" / "after").is_dir()  # rank 0 evaluated the solver's gathered copy
    got = _policy_finals(sharded)
    if finetune == "lora":
        assert all((sharded / "final" / pid / "adapter").is_dir() for pid in POLICIES)

    single = tmp_path / "single"
    t0 = time.monotonic()
    _one_process(config, single, overrides)
    print(f"two policies, {schedule}, {finetune}: 2 ranks {wall:.0f} s, one process {time.monotonic() - t0:.0f} s")
    steps = _multi_steps(sharded)
    assert steps == _multi_steps(single)
    trained = [sorted(per) for _, _, per in steps]
    if schedule == "concurrent":
        assert trained == [list(POLICIES)] * 4
    else:  # alternating_kept: step k trains policy k mod 2
        assert trained == [["solver"], ["verifier"]] * 2
    for pid in POLICIES:  # each policy updated, and was published with the step's version
        assert sum(per[pid][0] for _, _, per in steps if pid in per) > 0, pid
        assert all(per[pid][2] == v for _, v, per in steps if pid in per and per[pid][0]), pid
        # where each publish came from: LoRA gathers its adapter; a full fine-tune gathers a policy whole until its
        # first update is published, then publishes its ranks' slice diffs (trainers.shard_delta)
        if kl:  # the KL term was live on both sides: the policy drifted from its reference after its first update
            for folder in (sharded, single):
                kls = [r[f"{pid}/train/kl"] for r in _steps(folder) if f"{pid}/train/kl" in r]
                assert kls and max(kls) > 0, (pid, folder.name, kls)
        sources = [r[f"publish/{pid}/source"] for r in _steps(sharded) if f"publish/{pid}/source" in r]
        if finetune == "lora":
            assert set(sources) == {"gathered copy"}, (pid, sources)
        else:
            first = sources.index("gathered copy", 1) if pid == "verifier" else 0  # published unchanged at step 1
            assert sources[first + 1:] == ["shard deltas"] * (len(sources) - first - 1) and first + 1 < len(sources), \
                (pid, sources)
    want = _policy_finals(single)
    # float32 reduction order through 8 Adam steps: measured 2e-6 (LoRA) and 1.1e-3 (full) of the distance moved;
    # a policy left stale or trained on the wrong samples is off by about the whole distance
    tol = 2e-3 if finetune == "lora" else 5e-3
    for pid in POLICIES:
        moved = _distance(want[pid], _weights_at(Path(bases[pid])))
        worst = _distance(got[pid], want[pid])
        print(f"  {pid}: moved {moved:.2e}, 2 ranks vs one process {worst:.2e}")
        assert moved > 1e-3 and worst < tol * moved, (pid, worst, moved)


def test_sharded_two_policies_resume(tiny_sft_model: str, tmp_path: Path) -> None:
    """The step-2 checkpoint of a sharded two-policy run (alternating schedule, LoRA) holds both policies' shards
    and resumes on 2 ranks: the services start from both policies' gathered weights, the run publishes the same
    versions and ends with both policies where the uninterrupted run ended."""
    run = tmp_path / "run"
    config = _multi_config(tmp_path, tiny_sft_model, run, schedule="alternating", finetune="lora")
    overrides = [*MULTI, "eval.after=false"]
    _torchrun(config, *overrides)
    ck = run / "checkpoints" / "step-000002"
    assert {p.name for p in ck.glob("*.dcp")} == {f"{pid}.dcp" for pid in POLICIES}
    assert json.loads((ck / "state.json").read_text())["world_size"] == 2
    want = _policy_finals(run)
    init = _weights_at(Path(tiny_sft_model))
    moved = {pid: _distance(want[pid], init) for pid in POLICIES}
    assert all(m > 1e-3 for m in moved.values()), moved

    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed, ignore=shutil.ignore_patterns("final", "result.json", "step-000004", ".lock"))
    out, _ = _torchrun(config, *overrides, f"run.out_dir={resumed}")
    assert "resumed from" in out and "at step 2" in out
    assert _multi_steps(resumed) == _multi_steps(run)
    delivered = [r.get(f"publish/{pid}/services/rollout-0") for r in _steps(resumed) for pid in POLICIES
                 if r["step"] >= 2 and f"publish/{pid}/kind" in r]
    assert delivered and set(delivered) == {"ok"}  # every delta after the resume applied on the restored weights
    got = _policy_finals(resumed)
    for pid in POLICIES:
        worst = _distance(got[pid], want[pid])
        print(f"  {pid}: moved {moved[pid]:.2e}, resumed vs uninterrupted {worst:.2e}")
        assert worst < 2e-3 * moved[pid], (pid, worst, moved[pid])


def _one_process(config: Path, out: Path, overrides: list[str]) -> dict[str, Any]:
    import tiny_lookup  # noqa: F401  (registers the env)
    from agentgym.recipes import run_training
    from agentgym.trainers.config import load_train_config

    return run_training(load_train_config(config, [*overrides, f"run.out_dir={out}", "trainer.strategy=single"]))


def _final_weights_of_model(path: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    return {n: p.detach().float() for n, p in model.named_parameters()}
