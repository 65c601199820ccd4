"""Load an experiment file: YAML -> :class:`~stormwatch.chaos.experiment.model.Experiment`, or every problem.

Every problem is reported at once, each with the file, the field path in the
file (``method[0].fault.rank``) and what is allowed, as an
:class:`~stormwatch.chaos.errors.InvalidExperiment` (a ``ConfigError``: the CLI
exits 2). Nothing else happens before an experiment is valid.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import promql_parser
import pydantic
import yaml
from pydantic import BaseModel

from stormwatch.chaos.errors import InvalidExperiment, Issue
from stormwatch.chaos.experiment.model import (
    PLACEHOLDERS,
    ActionActivity,
    Experiment,
    HttpProvider,
    ProbeActivity,
    PrometheusProvider,
    Provider,
    UntilActivity,
    placeholders_in,
)
from stormwatch.chaos.experiment.model import expand as fill_placeholders
from stormwatch.chaos.experiment.selection import (
    SelectionError,
    Shape,
    blast_radius_problem,
    expand,
    static_shape,
)

#: Largest experiment file accepted (bytes); real ones are a few KiB.
MAX_EXPERIMENT_BYTES = 1024 * 1024


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML keeps the last one silently)
    and anchors/aliases (a "billion laughs" file would expand to gigabytes)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML anchors and aliases (&name, *name) are not allowed in experiment "
                "files; write each value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


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
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        issue = Issue("", f"not valid YAML: {_yaml_message(exc)}", line)
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
        issues = [_issue(err) for err in exc.errors()]
        raise InvalidExperiment(file, _with_lines(issues, text)) from exc
    issues = semantic_issues(experiment)
    if issues:
        raise InvalidExperiment(file, _with_lines(issues, text))
    return experiment


def _with_lines(issues: list[Issue], text: str) -> list[Issue]:
    """``issues`` with the line of each field (or of its nearest enclosing key) filled in."""
    try:
        root = yaml.compose(text, Loader=_UniqueKeyLoader)
    except (yaml.YAMLError, RecursionError):  # pragma: no cover - it loaded a moment ago
        return issues
    lines: dict[str, int] = {}
    _index_lines(root, "", lines)
    out = []
    for issue in issues:
        path = issue.path
        while path and path not in lines:
            parent = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path)
            path = "" if parent == path else parent  # a top-level key: no enclosing key
        out.append(Issue(issue.path, issue.message, lines.get(path)))
    return out


def _index_lines(node: yaml.Node | None, path: str, out: dict[str, int]) -> None:
    """Record the 1-based line of every mapping key and sequence item under ``node``."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = _join(path, key_node.value)
            out.setdefault(child, key_node.start_mark.line + 1)
            _index_lines(value_node, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = _join(path, index)
            out.setdefault(child, item.start_mark.line + 1)
            _index_lines(item, child, out)


def semantic_issues(experiment: Experiment) -> list[Issue]:
    """Problems that span fields (names unique, faults while the job runs, placeholders known)."""
    issues: list[Issue] = []
    seen: dict[str, str] = {}
    activities = [("method", a) for a in experiment.method]
    activities += [("rollbacks", a) for a in experiment.rollbacks]
    counters = {"method": 0, "rollbacks": 0}
    for section, activity in activities:
        path = f"{section}[{counters[section]}]"
        counters[section] += 1
        if activity.name in seen:
            issues.append(
                Issue(
                    f"{path}.name",
                    f"duplicate activity name {activity.name!r} "
                    f"(already used by {seen[activity.name]}); names must be unique",
                )
            )
        seen.setdefault(activity.name, path)
        when = activity.when if isinstance(activity, ActionActivity) else None
        if when is not None and when.step >= experiment.job.steps:
            issues.append(
                Issue(
                    f"{path}.when.step",
                    f"must be < job.steps ({experiment.job.steps}) so the fault lands while "
                    f"the job runs (got {when.step})",
                )
            )
        world = experiment.job.fixed_world_size
        rank = activity.fault.target_rank() if isinstance(activity, ActionActivity) else None
        if (
            isinstance(activity, ActionActivity)
            and activity.target is None
            and world is not None
            and rank is not None
            and rank >= world
        ):
            issues.append(
                Issue(
                    f"{path}.fault.rank",
                    f"rank {rank} is out of range: the job has "
                    f"{world} ranks ({_world_source(experiment)}), so use 0-{world - 1}",
                )
            )
        if isinstance(activity, ActionActivity):
            issues.extend(_selection_issues(path, activity, experiment))
        if isinstance(activity, ProbeActivity):
            issues.extend(_provider_issues(f"{path}.provider", activity.provider))
        if isinstance(activity, UntilActivity):
            issues.extend(_query_issues(f"{path}.query", activity.query))
    job = experiment.job
    if (
        job.world_size is not None
        and job.nodes is not None
        and job.nproc_per_node is not None
        and job.world_size != job.nodes * job.nproc_per_node
    ):
        issues.append(
            Issue(
                "job.world_size",
                f"{job.world_size} != job.nodes * job.nproc_per_node "
                f"({job.nodes} * {job.nproc_per_node}); give one or make them agree",
            )
        )
    for i, guard in enumerate(experiment.safeguards):
        issues.extend(_provider_issues(f"safeguards[{i}].provider", guard.provider))
    shape = static_shape(experiment)
    if shape is not None:
        try:
            problem = blast_radius_problem(experiment, shape)
        except SelectionError:
            problem = None  # reported per action above
        if problem is not None:
            issues.append(Issue("blast_radius.max_fraction_of_ranks", problem))
    probe_names: set[str] = set()
    for i, probe in enumerate(experiment.steady_state_hypothesis.probes):
        path = f"steady_state_hypothesis.probes[{i}]"
        if probe.name in probe_names:
            issues.append(Issue(f"{path}.name", f"duplicate probe name {probe.name!r}"))
        probe_names.add(probe.name)
        if len(set(probe.phases)) != len(probe.phases):
            issues.append(Issue(f"{path}.phases", "list each phase once (before, after)"))
        issues.extend(_provider_issues(f"{path}.provider", probe.provider))
    return issues


def _world_source(experiment: Experiment) -> str:
    job = experiment.job
    if job.world_size is not None:
        return "job.world_size"
    return f"job.nodes * job.nproc_per_node = {job.nodes} * {job.nproc_per_node}"


def _selection_issues(path: str, action: ActionActivity, experiment: Experiment) -> list[Issue]:
    """A target selector must fit the fault kind, and the job's shape when the file fixes it."""
    shape = static_shape(experiment)
    if action.target is None and shape is None:
        return []
    try:
        expand(action, shape or Shape.generic(1, 1))
    except SelectionError as exc:
        if shape is None and "takes no 'target'" not in str(exc):
            return []  # the shape is known only at run time; checked then
        return [Issue(f"{path}.target" if action.target else f"{path}.fault", str(exc))]
    return []


def _query_issues(path: str, query: str, *, promql: bool = True) -> list[Issue]:
    """Unknown ``${placeholders}``; with ``promql``, a query Prometheus would reject (parsed
    by promql-parser, the placeholders standing in as ``1``), so a typo fails before any fault."""
    unknown = sorted({n for n in placeholders_in(query) if n not in PLACEHOLDERS})
    if unknown:
        allowed = ", ".join("${" + p + "}" for p in PLACEHOLDERS)
        return [Issue(path, f"unknown placeholder(s) {unknown} (allowed: {allowed})")]
    if promql:
        try:
            promql_parser.parse(fill_placeholders(query, dict.fromkeys(PLACEHOLDERS, "1")))
        except ValueError as exc:
            return [Issue(path, f"not valid PromQL: {exc}; fix the query (got {query!r})")]
    return []


def _provider_issues(path: str, provider: Provider) -> list[Issue]:
    if isinstance(provider, PrometheusProvider):
        return _query_issues(f"{path}.query", provider.query)
    if isinstance(provider, HttpProvider):
        return _query_issues(f"{path}.url", provider.url, promql=False)
    return []


# --- pydantic error -> Issue -------------------------------------------------------------------


def _issue(err: Any) -> Issue:
    kind: str = err["type"]
    loc: tuple[Any, ...] = tuple(err["loc"])
    ctx: dict[str, Any] = err.get("ctx") or {}
    if kind == "extra_forbidden":
        parent_path, parent = _resolve(Experiment, loc[:-1])
        path = _join(parent_path, loc[-1])
        valid = _keys(parent) if _is_model(parent) else "none"
        return Issue(path, f"unknown key {loc[-1]!r} (valid keys: {valid})")
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


def _join(path: str, element: Any) -> str:
    if isinstance(element, int):
        return f"{path}[{element}]"
    return f"{path}.{element}" if path else str(element)


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


def _yaml_message(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(exc).replace("\n", " ")


__all__ = ["MAX_EXPERIMENT_BYTES", "load_experiment", "parse_experiment", "semantic_issues"]
