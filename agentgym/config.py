"""The one config idiom: typed pydantic models whose problems raise :class:`~agentgym.errors.ConfigurationError`.

Every config (eval, train sections, dataflow) is a :class:`ConfigModel`: unknown keys are refused
(``extra="forbid"``), assignments are validated too, and every problem is listed at once in one
``ConfigurationError`` whose lines name the field::

    class LimitsConfig(ConfigModel):
        max_turns: int | None = Field(default=None, ge=1)

    LimitsConfig(max_turns=0)
    # ConfigurationError: LimitsConfig: 1 problem(s):
    #   - max_turns: Input should be greater than or equal to 1
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict

from agentgym.errors import ConfigurationError

__all__ = ["ConfigModel", "format_validation_error"]

M = TypeVar("M", bound="ConfigModel")


def format_validation_error(err: pydantic.ValidationError, source: str,
                            label: Callable[[str], str] | None = None) -> str:
    """One line per problem: ``source: N problem(s):`` then ``- field.path: what is wrong``.

    ``label`` renames a top-level field in the message (e.g. to the command-line option that set it).
    """
    lines = [f"{source}: {err.error_count()} problem(s):"]
    for e in err.errors():
        parts = [str(p) for p in e["loc"]]
        if parts and label is not None:
            parts[0] = label(parts[0])
        loc = ".".join(parts) or "(config)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling)"
        lines.append(f"  - {loc}: {msg}")
    return "\n".join(lines)


# How many ConfigModel constructions are under way in this context: only the outermost one turns
# pydantic's ValidationError into a ConfigurationError, so nested models report their errors at
# their own path (``rollout.group_size: ...``) inside the one error of the outermost model.
_nesting: contextvars.ContextVar[int] = contextvars.ContextVar("agentgym_config_nesting", default=0)


class ConfigModel(BaseModel):
    """Base of every AgentGym config: typed, ``extra="forbid"``, validated on assignment.

    Construction, :meth:`from_dict` and assignment raise :class:`~agentgym.errors.ConfigurationError`
    (never pydantic's own ``ValidationError``), listing every problem; models nested in a model are
    reported at their path in the outer model's error.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def __init__(self, /, **data: Any) -> None:
        token = _nesting.set(_nesting.get() + 1)
        try:
            super().__init__(**data)
        except pydantic.ValidationError as e:
            if _nesting.get() > 1:
                raise  # inside another model's validation: pydantic places these errors at their path
            raise ConfigurationError(format_validation_error(e, type(self).__name__)) from None
        finally:
            _nesting.reset(token)

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except pydantic.ValidationError as e:
            raise ConfigurationError(format_validation_error(e, type(self).__name__)) from None

    @classmethod
    def from_dict(cls: type[M], data: dict[str, Any], source: str | None = None,
                  label: Callable[[str], str] | None = None) -> M:
        """Validate a plain dict (a parsed TOML table); ``source`` names it in the error, ``label`` its fields."""
        token = _nesting.set(_nesting.get() + 1)
        try:
            return cls(**data)
        except pydantic.ValidationError as e:
            raise ConfigurationError(format_validation_error(e, source or cls.__name__, label)) from None
        finally:
            _nesting.reset(token)
