"""Exceptions of :mod:`stormwatch.plan` (tree drawn in the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

from stormwatch.errors import ConfigError, StormwatchError


class PlanError(StormwatchError):
    """The planner could not do something it was asked to (e.g. write the report)."""


class InvalidPlanInput(PlanError, ConfigError):
    """An input (flag, rates file, post-mortem) is invalid; the message names the field."""

    exit_code = 2


def from_validation_error(
    where: str, exc: ValidationError, names: Mapping[str, str] | None = None
) -> InvalidPlanInput:
    """One :class:`InvalidPlanInput` listing every pydantic error as ``where: field.path: msg``,
    or ``--option: msg`` for a field that ``names`` maps to the option that set it.

    Args:
        where: what was being validated (a file name, ``plan settings``).
        exc: the pydantic error to translate.
        names: field -> command-line option (``interval_s`` -> ``--interval``).
    """
    lines = []
    for err in exc.errors():
        parts = [str(p) for p in err["loc"]]
        if names and parts and parts[0] in names:
            parts[0] = names[parts[0]]
            where_loc = ".".join(parts)
        else:
            where_loc = f"{where}: {'.'.join(parts)}" if parts else where
        got = (
            f" (got {err['input']!r})"
            if "input" in err and not isinstance(err["input"], dict)
            else ""
        )
        message = str(err["msg"]).removeprefix("Value error, ")  # a validator names its field
        lines.append(f"{where_loc}: {message}{got}")
    return InvalidPlanInput("\n".join(lines))


__all__ = ["InvalidPlanInput", "PlanError", "from_validation_error"]
