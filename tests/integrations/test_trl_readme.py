"""The README's TRL example runs as written, with the tiny player in place of SmolLM2 (nothing downloaded).

Not in ``tests/core/test_readme.py``: building the tiny player and two TRL steps take 30 s or more on CPU.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

HERE = Path(__file__).resolve().parent
README = HERE.parents[1] / "README.md"
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


def readme_trl_block() -> str:
    text = README.read_text()
    section = text[text.index("## Use AgentGym envs from TRL"):]
    block = next((b for b in re.findall(r"```python\n(.*?)```", section, re.DOTALL) if "integrations.trl" in b), None)
    assert block is not None, "the README's TRL example is gone"
    return block


def test_readme_trl_example_runs(tiny_player: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = readme_trl_block()
    assert code.count('"smollm2-135m-instruct"') == 2 and "trainer.train()" in code
    player = tiny_player  # the TRL tests' player (tests/integrations/conftest.py)
    monkeypatch.chdir(tmp_path)  # GRPOConfig's default output_dir
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    ns: dict[str, object] = {"__name__": "readme_trl"}
    exec(compile(code.replace('"smollm2-135m-instruct"', repr(str(player))), "README.md", "exec"), ns)
    trainer = ns["trainer"]
    assert trainer.state.global_step == 2  # type: ignore[attr-defined]
    assert [h for h in trainer.state.log_history if "reward" in h]  # type: ignore[attr-defined]
