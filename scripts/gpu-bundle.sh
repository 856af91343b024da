#!/usr/bin/env bash
# Packs what scripts/gpu-smoke.sh needs on a GPU machine that has PyTorch and transformers but no package registry
# and no room for SmolLM2's weights (a lent machine whose working tree travels with a size cap):
#   DIR/whl/    agentgym's wheel and the wheels of its dependencies that such an image lacks, for CPython 3.12
#               manylinux x86-64 (pydantic, gymnasium, fastapi, uvicorn, ...; torch and transformers are not packed)
#   DIR/tiny/   a 2-layer Llama with random weights and SmolLM2's tokenizer and chat template (a few MB): the GPU
#               checks' model when SmolLM2 is not there (AGENTGYM_GPU_SMOKE_MODEL). It learns nothing useful; the
#               checks it serves are of the device path (placement, autocast, FSDP2 over nccl, weight publishing).
# On the GPU machine, in the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/whl/*.whl && export PYTHONPATH=/tmp/site
#   AGENTGYM_GPU_SMOKE_MODEL=$PWD/DIR/tiny PYTHON=python3 scripts/gpu-smoke.sh
#
# Usage: scripts/gpu-bundle.sh [DIR]   (default .gpu-bundle, which .gitignore leaves out of git)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu-bundle}
PY=${PYTHON:-.venv/bin/python}
rm -rf "$DIR" && mkdir -p "$DIR/whl"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR/whl" . >/dev/null
# pure-Python and manylinux wheels for the target interpreter; each pinned to the version this venv runs
pkgs=()
for name in gymnasium farama-notifications pydantic pydantic-core annotated-types typing-inspection fastapi starlette \
            uvicorn httptools websockets bm25s rapidfuzz msgspec gguf; do
  v=$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  if [ -z "$v" ]; then echo "error: $name is not installed in $PY's environment (run make venv)" >&2; exit 2; fi
  pkgs+=("$name==$v")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$DIR/whl" "${pkgs[@]}"
"$PY" - "$DIR/tiny" <<'PY'
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from agentgym.policies.models import resolve_model

src, out = Path(resolve_model("smollm2-135m-instruct")), Path(sys.argv[1])
cfg = AutoConfig.from_pretrained(src)
cfg.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16})
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(out)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    if (src / name).is_file():
        shutil.copy(src / name, out / name)
PY
du -sh "$DIR/whl" "$DIR/tiny"
