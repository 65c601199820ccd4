"""A target file's validation errors, as :class:`~stormwatch.platforms.errors.TargetIssue`
(field path, message with the fix): what :func:`stormwatch.platforms.targets.parse_target_file`
reports for each pydantic error."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic import BaseModel

from stormwatch.platforms.errors import TargetIssue
from stormwatch.yamltext import join_path


def validation_issue(err: Any, root: type[BaseModel]) -> TargetIssue:
    """One pydantic error of ``root`` (``ValidationError.errors()`` item) as a
    :class:`TargetIssue`: its field path and a message that says the fix (the valid keys
    of a mapping, the shape a pattern wants)."""
    loc = tuple(e for e in err["loc"] if not (isinstance(e, str) and "[" in e))
    path = ""
    for element in loc:
        path = join_path(path, element)
    kind = err["type"]
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        valid = _valid_keys(root, loc[:-1])
        return TargetIssue(path, f"unknown key {loc[-1]!r} (valid keys: {valid})")
    if kind == "missing":
        return TargetIssue(path, "required field missing")
    message = str(err["msg"]).removeprefix("Value error, ")
    named = re.match(r"(\w+): ", message)
    if kind == "value_error" and named and named[1] in _valid_keys(root, loc).split(", "):
        # HttpOptions names the field in its message: put it in the path instead.
        path, message = join_path(path, named[1]), message[named.end() :]
    if kind == "string_pattern_mismatch":
        message = _PATTERN_FIX.get(str(loc[-1]), message)
    if kind != "value_error" and "input" in err:
        message += f" (got {err['input']!r:.60})"
    if kind == "string_type" and isinstance(err.get("input"), int | float):
        message += f"; quote it: '{err['input']}'"  # YAML reads 123456 as a number
    return TargetIssue(path, message)


_PATTERN_FIX = {
    "namespace": "not a Kubernetes namespace name (lowercase a-z, 0-9 and '-', at most 63)",
    "selector": "not a label selector: key=value pairs joined by ',' (app=stormwatch-agent)",
    "host": "must hold {node} or {addr}, e.g. {node}.cluster.example",
    "id": "not a Slurm job id (digits, or <array id>_<index>)",
}


def _valid_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    tp: Any = root
    for element in loc:
        field = tp.model_fields.get(element) if _is_model(tp) else None
        tp = _unwrap(field.annotation) if field is not None else None
    if _is_model(tp):
        return ", ".join(tp.model_fields)
    if dataclasses.is_dataclass(tp):
        return ", ".join(f.name for f in dataclasses.fields(tp))
    return "none"


def _unwrap(tp: Any) -> Any:
    args = [a for a in getattr(tp, "__args__", ()) if a is not type(None)]
    return args[0] if len(args) == 1 else tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


__all__ = ["validation_issue"]
