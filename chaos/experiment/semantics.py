"""Checks of a valid experiment that span fields: names used once, faults while the job runs
on ranks it has, targets that fit, known placeholders and valid PromQL, the blast radius.

Each check returns :class:`~stormwatch.chaos.errors.Issue` s naming the field path in the
file (``method[0].when.step``); :func:`~stormwatch.chaos.experiment.loader.parse_experiment`
adds their lines and raises them together.
"""

from __future__ import annotations

import promql_parser

from stormwatch.chaos.errors import Issue, SelectionError
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
    Shape,
    blast_radius_problem,
    expand,
    rank_range,
    static_shape,
)
from stormwatch.words import plural


def semantic_issues(experiment: Experiment) -> list[Issue]:
    """Problems that span fields (names unique, faults while the job runs, placeholders known),
    in file order: the activities, the job's shape, the safeguards, the blast radius, the
    steady-state hypothesis."""
    return [
        *_activity_issues(experiment),
        *_job_shape_issues(experiment),
        *_safeguard_issues(experiment),
        *_blast_radius_issues(experiment),
        *_hypothesis_issues(experiment),
    ]


def _activity_issues(experiment: Experiment) -> list[Issue]:
    """Each method and rollback activity: a name used once, then its own kind's checks."""
    issues: list[Issue] = []
    seen: dict[str, str] = {}
    activities = [(f"method[{i}]", a) for i, a in enumerate(experiment.method)]
    activities += [(f"rollbacks[{i}]", a) for i, a in enumerate(experiment.rollbacks)]
    for path, activity in activities:
        if activity.name in seen:
            issues.append(
                Issue(
                    f"{path}.name",
                    f"duplicate activity name {activity.name!r} "
                    f"(already used by {seen[activity.name]}); names must be unique",
                )
            )
        seen.setdefault(activity.name, path)
        if isinstance(activity, ActionActivity):
            issues.extend(_action_issues(path, activity, experiment))
        if isinstance(activity, ProbeActivity):
            issues.extend(_provider_issues(f"{path}.provider", activity.provider))
        if isinstance(activity, UntilActivity):
            issues.extend(_query_issues(f"{path}.query", activity.query))
    return issues


def _action_issues(path: str, action: ActionActivity, experiment: Experiment) -> list[Issue]:
    """An action's fault lands while the job runs, on a rank the job has, where its target fits."""
    issues: list[Issue] = []
    job = experiment.job
    when = action.when
    if when is not None and when.step >= job.steps:
        issues.append(
            Issue(
                f"{path}.when.step",
                f"must be < job.steps ({job.steps}) so the fault lands while "
                f"the job runs (got {when.step})",
            )
        )
    world = job.fixed_world_size
    rank = action.fault.target_rank()
    if action.target is None and world is not None and rank is not None and rank >= world:
        issues.append(
            Issue(
                f"{path}.fault.rank",
                f"rank {rank} is out of range: the job has {plural(world, 'rank')} "
                f"({_world_source(experiment)}), so use {rank_range(world)}",
            )
        )
    issues.extend(_selection_issues(path, action, experiment))
    return issues


def _job_shape_issues(experiment: Experiment) -> list[Issue]:
    """``job.world_size`` agrees with ``job.nodes * job.nproc_per_node`` when all are given."""
    job = experiment.job
    if job.world_size is None or job.nodes is None or job.nproc_per_node is None:
        return []
    if job.world_size == job.nodes * job.nproc_per_node:
        return []
    return [
        Issue(
            "job.world_size",
            f"{job.world_size} != job.nodes * job.nproc_per_node "
            f"({job.nodes} * {job.nproc_per_node}); give one or make them agree",
        )
    ]


def _safeguard_issues(experiment: Experiment) -> list[Issue]:
    """Each safeguard's provider (placeholders, PromQL)."""
    issues: list[Issue] = []
    for i, guard in enumerate(experiment.safeguards):
        issues.extend(_provider_issues(f"safeguards[{i}].provider", guard.provider))
    return issues


def _blast_radius_issues(experiment: Experiment) -> list[Issue]:
    """The faults touch no more ranks than ``blast_radius`` allows (when the file fixes the
    job's shape; otherwise checked on the real job before anything is injected)."""
    shape = static_shape(experiment)
    if shape is None:
        return []
    try:
        problem = blast_radius_problem(experiment, shape)
    except SelectionError:
        return []  # reported per action
    return [] if problem is None else [Issue("blast_radius.max_fraction_of_ranks", problem)]


def _hypothesis_issues(experiment: Experiment) -> list[Issue]:
    """Each steady-state probe: a name used once, each phase once, its provider."""
    issues: list[Issue] = []
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
        # A kind that takes no target is refused by the model already (ActionActivity).
        if shape is None:
            return []  # the shape is known only at run time; checked then
        return [Issue(f"{path}.target" if action.target else f"{path}.fault", str(exc))]
    return []


def _query_issues(path: str, query: str, *, promql: bool = True) -> list[Issue]:
    """Unknown ``${placeholders}``; with ``promql``, a query Prometheus would reject (parsed
    by promql-parser, the placeholders standing in as ``1``, ``${since_start}`` as ``1s``), so a
    typo fails before any fault."""
    unknown = sorted({n for n in placeholders_in(query) if n not in PLACEHOLDERS})
    if unknown:
        allowed = ", ".join("${" + p + "}" for p in PLACEHOLDERS)
        return [Issue(path, f"unknown placeholder(s) {unknown} (allowed: {allowed})")]
    if promql:
        try:
            stand_ins = {**dict.fromkeys(PLACEHOLDERS, "1"), "since_start": "1s"}
            promql_parser.parse(fill_placeholders(query, stand_ins))
        except ValueError as exc:
            return [Issue(path, f"not valid PromQL: {exc}; fix the query (got {query!r})")]
    return []


def _provider_issues(path: str, provider: Provider) -> list[Issue]:
    if isinstance(provider, PrometheusProvider):
        return _query_issues(f"{path}.query", provider.query)
    if isinstance(provider, HttpProvider):
        return _query_issues(f"{path}.url", provider.url, promql=False)
    return []


__all__ = ["semantic_issues"]
