"""Load an experiment file: YAML -> :class:`~stormwatch.chaos.experiment.model.Experiment`, or every problem.

Every problem is reported at once (pydantic's, translated to the file's field paths
here, then the checks that span fields, :mod:`.semantics`), each with the file, the
field path in the file (``method[0].fault.rank``) and what is allowed, as an
:class:`~stormwatch.chaos.errors.InvalidExperiment` (a ``ConfigError``: the CLI
exits 2). Nothing else happens before an experiment is valid.
"""

from __future__ import annotations

import difflib
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pydantic
import yaml
from pydantic import BaseModel

from stormwatch.chaos.errors import InvalidExperiment, Issue
from stormwatch.chaos.experiment.model import Experiment
from stormwatch.chaos.experiment.semantics import semantic_issues
from stormwatch.yamltext import (
    StrictLoader,
    join_path,
    key_lines,
    line_of,
    yaml_error_line,
    yaml_problem,
)

#: Largest experiment file accepted (bytes); real ones are a few KiB.
MAX_EXPERIMENT_BYTES = 1024 * 1024


class _UniqueKeyLoader(StrictLoader):
    """:class:`~stormwatch.yamltext.StrictLoader` for experiment files."""

    kind = "experiment files"


def load_experiment(path: Path | str) -> Experiment:
    """Read and validate an experiment file.

    Raises:
        InvalidExperiment: the file is missing, larger than :data:`MAX_EXPERIMENT_BYTES`,
            not UTF-8, not YAML (anchors and aliases are refused, as is absurd
            nesting), or not a valid experiment; lists every problem with its field
            path and what is allowed.
    """
    file = Path(path)
    try:
        with file.open("rb") as fh:
            data = fh.read(MAX_EXPERIMENT_BYTES + 1)
    except OSError as exc:
        raise InvalidExperiment(file, [Issue("", f"cannot read the file: {exc.strerror}")]) from exc
    if len(data) > MAX_EXPERIMENT_BYTES:
        raise InvalidExperiment(file, [_too_large()])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InvalidExperiment(
            file, [Issue("", f"not UTF-8 text (byte {exc.start}, line {line}): save it as UTF-8")]
        ) from exc
    return parse_experiment(text, file)


def _too_large() -> Issue:
    return Issue(
        "", f"larger than {MAX_EXPERIMENT_BYTES // 1024} KiB; an experiment file is a few KiB"
    )


def parse_experiment(text: str, file: Path | str = "<experiment>") -> Experiment:
    """Validate experiment YAML ``text``; ``file`` only names it in messages.

    Raises:
        InvalidExperiment: see :func:`load_experiment`.
    """
    if len(text) > MAX_EXPERIMENT_BYTES:
        raise InvalidExperiment(file, [_too_large()])
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        line = yaml_error_line(exc, text)
        issue = Issue("", f"not valid YAML: {_yaml_message(exc, text)}", line)
        raise InvalidExperiment(file, [issue]) from exc
    except RecursionError as exc:
        raise InvalidExperiment(
            file, [Issue("", "nested too deeply to read (thousands of [ or { levels)")]
        ) from exc
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise InvalidExperiment(
            file, [Issue("", f"must be a mapping with keys {_keys(Experiment)} (got {kind})")]
        )
    try:
        experiment = Experiment.model_validate(data)
    except pydantic.ValidationError as exc:
        raise InvalidExperiment(file, _with_lines(_issues(exc.errors()), text)) from exc
    issues = semantic_issues(experiment)
    if issues:
        raise InvalidExperiment(file, _with_lines(issues, text))
    return experiment


def _with_lines(issues: list[Issue], text: str) -> list[Issue]:
    """``issues`` with the line of each field (or of its nearest enclosing key) filled in."""
    lines = key_lines(text, _UniqueKeyLoader)
    return [Issue(i.path, i.message, line_of(i.path, lines)) for i in issues]


# --- pydantic error -> Issue -------------------------------------------------------------------


def _issues(errors: list[Any]) -> list[Issue]:
    """pydantic's ``errors`` as issues. A misspelt key comes first, with its did-you-mean;
    the "required field missing" of the field it names is left out (the same mistake)."""
    misspelt: list[Issue] = []
    meant: set[str] = set()
    others: list[tuple[str, Issue]] = []
    for err in errors:
        if err["type"] == "extra_forbidden":
            issue, near = _unknown_key(tuple(err["loc"]))
            if near is not None:
                misspelt.append(issue)
                meant.add(near)
                continue
        else:
            issue = _issue(err)
        others.append((err["type"], issue))
    return misspelt + [i for kind, i in others if not (kind == "missing" and i.path in meant)]


def _unknown_key(loc: tuple[Any, ...]) -> tuple[Issue, str | None]:
    """The issue of the unknown key at ``loc``, and the path of the key it is closest to
    (None: none is close)."""
    parent_path, parent = _resolve(Experiment, loc[:-1])
    path = _join(parent_path, loc[-1])
    if not _is_model(parent):
        return Issue(path, f"unknown key {loc[-1]!r} (valid keys: none)"), None
    near = difflib.get_close_matches(str(loc[-1]), list(parent.model_fields), n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    issue = Issue(path, f"unknown key {loc[-1]!r} ({hint}valid keys: {_keys(parent)})")
    return issue, _join(parent_path, near[0]) if near else None


def _issue(err: Any) -> Issue:
    """One pydantic error other than an unknown key (:func:`_unknown_key`) as an issue."""
    kind: str = err["type"]
    loc: tuple[Any, ...] = tuple(err["loc"])
    ctx: dict[str, Any] = err.get("ctx") or {}
    path, target = _resolve(Experiment, loc)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        field = str(ctx.get("discriminator", "kind")).strip("'\"")
        allowed = ctx.get("expected_tags") or ", ".join(repr(t) for t in _tags(target))
        if kind == "union_tag_not_found":
            return Issue(_join(path, field), f"required (allowed: {allowed})")
        return Issue(_join(path, field), f"unknown {field} {ctx.get('tag')!r} (allowed: {allowed})")
    if kind == "missing":
        described = _describe(target)
        return Issue(path, "required field missing" + (f" ({described})" if described else ""))
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind not in ("value_error", "assertion_error") and "input" in err:
        message += f" (got {_short(err['input'])})"
    return Issue(path, message)


_join = join_path


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` down to the type that pydantic reports locations in."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
            continue
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) == 1:
                tp = members[0]
                continue
        return tp


def _resolve(root: Any, loc: tuple[Any, ...]) -> tuple[str, Any]:
    """Walk pydantic's ``loc`` through the model types; returns (file path, type there).

    Discriminated-union tags in ``loc`` (``'kill_rank'``) are not part of the
    file's structure, so they select the member type and are not printed.
    """
    path = ""
    tp: Any = root
    for element in loc:
        tp = _unwrap(tp)
        if _is_model(tp) and isinstance(element, str):
            field = tp.model_fields.get(element)
            path = _join(path, element)
            tp = field.annotation if field is not None else None
            continue
        origin = get_origin(tp)
        if origin is list and isinstance(element, int):
            path = _join(path, element)
            tp = get_args(tp)[0]
            continue
        if origin in (Union, types.UnionType) and isinstance(element, str):
            member = _member_for_tag(tp, element)
            if member is not None:
                tp = member
                continue
        path = _join(path, element)
        tp = None
    return path, _unwrap(tp)


def _member_for_tag(union: Any, tag: str) -> Any:
    for member in get_args(union):
        if not _is_model(member):
            continue
        for field in member.model_fields.values():
            if get_origin(field.annotation) is Literal and get_args(field.annotation) == (tag,):
                return member
    return None


def _tags(union: Any) -> list[str]:
    """The discriminator values of a tagged union's members (``['kill_rank', ...]``)."""
    if get_origin(union) not in (Union, types.UnionType):
        return []
    return [
        get_args(f.annotation)[0]
        for m in get_args(union)
        if _is_model(m)
        for f in m.model_fields.values()
        if get_origin(f.annotation) is Literal and len(get_args(f.annotation)) == 1
    ]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _keys(model: Any) -> str:
    return ", ".join(model.model_fields) if _is_model(model) else "none"


def _describe(tp: Any) -> str:
    if _is_model(tp):
        required = [n for n, f in tp.model_fields.items() if f.is_required()]
        return f"a mapping with {', '.join(required)}" if required else "a mapping"
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        tags = _tags(tp)
        return "one of the kinds " + ", ".join(repr(t) for t in tags) if tags else ""
    if get_origin(tp) is list:
        return "a list"
    if isinstance(tp, type):
        return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(
            tp, tp.__name__
        )
    return ""


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_yaml_message = yaml_problem


__all__ = ["MAX_EXPERIMENT_BYTES", "load_experiment", "parse_experiment"]
