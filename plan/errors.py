"""Exceptions of :mod:`stormwatch.plan` (tree drawn in the package docstring)."""

from __future__ import annotations

from pydantic import ValidationError

from stormwatch.errors import ConfigError, StormwatchError


class PlanError(StormwatchError):
    """The planner could not do something it was asked to (e.g. write the report)."""


class InvalidPlanInput(PlanError, ConfigError):
    """An input (flag, rates file, post-mortem) is invalid; the message names the field."""

    exit_code = 2


def from_validation_error(where: str, exc: ValidationError) -> InvalidPlanInput:
    """One :class:`InvalidPlanInput` listing every pydantic error as ``where: field.path: msg``.

    Args:
        where: what was being validated (a file name, ``plan settings``).
        exc: the pydantic error to translate.
    """
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        got = (
            f" (got {err['input']!r})"
            if "input" in err and not isinstance(err["input"], dict)
            else ""
        )
        message = str(err["msg"]).removeprefix("Value error, ")  # a validator names its field
        lines.append(f"{where}: {loc + ': ' if loc else ''}{message}{got}")
    return InvalidPlanInput("\n".join(lines))


__all__ = ["InvalidPlanInput", "PlanError", "from_validation_error"]
