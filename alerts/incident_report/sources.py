"""What an incident post-mortem reads: the responder's records, the lab's files, Prometheus.

:func:`gather` collects everything once into :class:`Inputs`; a missing or
unreadable source leaves its part empty and says why in ``Inputs.inputs``
(never raises for a source). Each file is read through its writer's model. Lab
layout (docs/ARCHITECTURE.md):

* ``<run>/jobs/<job>/logs/rank<R>.jsonl``: the trainer's rank logs (steps, restarts;
  :mod:`stormwatch.telemetry.ranklogs`, as the engine's progress);
* ``<run>/jobs/<job>/logs/dumps/rank<R>.attempt<A>.pid<P>.json`` (older: ``rank<R>.json``):
  flight-recorder dumps, one per rank and attempt (:mod:`stormwatch.telemetry.dump`);
* ``<run>/jobs/<job>/logs/spans/rank<R>.jsonl``: trace spans (OpenTelemetry JSON lines);
* ``<run>/nodes/<node>/agent/events.jsonl``: the agents' rank events
  (:mod:`stormwatch.agent.watch.events`);
* ``<run>/experiments/<id>/journal.json``: chaos journals (:mod:`stormwatch.contracts.journal`);
* ``<run>/target.yaml``: the lab's nodes and ranks per node, as ``lab up`` writes them
  (:func:`stormwatch.platforms.read_lab_target`, :func:`stormwatch.platforms.lab_placement`);
* on the ``slurm`` platform, Slurm's own record of the job (requeues, starts, ends) and of
  the nodes' drain/down reasons (:func:`stormwatch.platforms.slurm_history.read_slurm_history`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stormwatch.agent.watch.events import AgentEvent, read_agent_events
from stormwatch.alerts.incident_report.queries import read_prometheus
from stormwatch.alerts.responder.audit import AuditEntry
from stormwatch.clients.http import HttpOptions
from stormwatch.contracts.journal import Journal, load_journal
from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.contracts.responder import ActionRecord, IncidentRecord
from stormwatch.platforms.errors import BackendError, InvalidTargetFile
from stormwatch.platforms.lab import lab_placement, read_lab_target
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.platforms.slurm_history import SlurmEvent, read_slurm_history
from stormwatch.postmortem import RankProgress
from stormwatch.telemetry.dump import DumpRecord, read_all_dumps
from stormwatch.telemetry.ranklogs import job_progress, read_job_logs

log = logging.getLogger(__name__)

#: Seconds of context plotted and read before the onset and after the close.
CONTEXT_BEFORE_S = 120.0
CONTEXT_AFTER_S = 30.0


@dataclass(frozen=True)
class Span:
    """One trace span: ``name`` on ``rank`` from ``start`` to ``end`` (Unix s); ``step``: its
    ``step`` attribute (the step a save, a load or a step span is of), when it has one."""

    name: str
    rank: int | None
    start: float
    end: float
    error: bool
    step: int | None = None


@dataclass
class Inputs:
    """Everything one post-mortem is built from (see the module docstring).

    Attributes:
        window: the Unix seconds read around the incident (:func:`incident_window`).
        progress: rank -> the job's progress from its rank logs.
        dumps: rank -> its latest flight-recorder dump written in the window (whether any
            was written; the culprit is drawn from :func:`stormwatch.postmortem.incident_dumps`
            of ``all_dumps``: those taken before the responder's stop).
        all_dumps: every dump written in the window, of every attempt, by time.
        prometheus: name -> {series label text -> [(t, value)]} from range queries.
        prometheus_now: name -> {series label text -> value} from instant queries at
            the window's end.
        slurm_events: Slurm's job and node events in the window (slurm platform only).
        inputs: source -> what was read (files, URLs) or why not.
    """

    incident: IncidentRecord
    actions: list[ActionRecord]
    audit: list[AuditEntry]
    window: tuple[float, float]
    progress: dict[int, RankProgress] = field(default_factory=dict)
    dumps: dict[int, DumpRecord] = field(default_factory=dict)
    all_dumps: list[DumpRecord] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    agent_events: list[AgentEvent] = field(default_factory=list)
    journals: list[Journal] = field(default_factory=list)
    rank_nodes: dict[int, str] = field(default_factory=dict)
    prometheus: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    prometheus_now: dict[str, dict[str, float]] = field(default_factory=dict)
    slurm_events: list[SlurmEvent] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)


def incident_job(incident: IncidentRecord) -> str | None:
    """The incident's training job (its or its first alert's ``training_job`` label)."""
    return incident.labels.get(TRAINING_JOB_LABEL) or incident.first_alert.labels.get(
        TRAINING_JOB_LABEL
    )


def incident_window(incident: IncidentRecord, now: float) -> tuple[float, float]:
    """Unix seconds read around the incident: two minutes before the first alert to 30 s after."""
    end = incident.closed_at or incident.ends_at or now
    return incident.starts_at - CONTEXT_BEFORE_S, min(now, end + CONTEXT_AFTER_S)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a torn last line while the writer appends
        if isinstance(item, dict):
            out.append(item)
    return out


def _iso(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def read_spans(spans_dir: Path, start: float, end: float) -> list[Span]:
    """Spans overlapping ``[start, end]`` from ``<dir>/rank<R>.jsonl`` (ConsoleSpanExporter JSON)."""
    spans = []
    for path in sorted(spans_dir.glob("rank*.jsonl")):
        for item in _read_jsonl(path):
            begin, finish = _iso(item.get("start_time")), _iso(item.get("end_time"))
            if begin is None or finish is None or finish < start or begin > end:
                continue
            resource = (item.get("resource") or {}).get("attributes") or {}
            rank = resource.get("rank")
            status = (item.get("status") or {}).get("status_code", "")
            step = (item.get("attributes") or {}).get("step")
            spans.append(
                Span(
                    name=str(item.get("name", "?")),
                    rank=rank if isinstance(rank, int) else None,
                    start=begin,
                    end=finish,
                    error=status == "ERROR",
                    step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                )
            )
    return spans


def _lab_rank_nodes(run_dir: Path) -> dict[int, str]:
    """rank -> node from the target file ``lab up`` wrote (torchrun places ranks node by
    node, :func:`lab_placement`); empty without a readable one."""
    try:
        target = read_lab_target(run_dir)
    except InvalidTargetFile as exc:
        log.warning("%s", exc)
        return {}
    if target is None or target.lab is None:
        return {}
    return lab_placement(target.lab)


def _read_job(inputs: Inputs, logs_dir: Path, since: float) -> None:
    """The job's rank logs, the dumps written since ``since`` and the spans of the window."""
    start, end = inputs.window
    if not logs_dir.is_dir():
        inputs.inputs["rank logs"] = f"none: {logs_dir} does not exist"
        return
    inputs.progress = job_progress(read_job_logs(logs_dir))
    inputs.inputs["rank logs"] = f"{logs_dir} ({len(inputs.progress)} ranks)"
    inputs.all_dumps = read_all_dumps(logs_dir / "dumps", since, end)  # not a later incident's
    inputs.dumps = {record.rank: record for record in inputs.all_dumps}  # the latest per rank
    inputs.inputs["flight-recorder dumps"] = (
        f"{logs_dir / 'dumps'} ({len(inputs.all_dumps)} written since the onset, "
        f"{len(inputs.dumps)} ranks)"
    )
    inputs.spans = read_spans(logs_dir / "spans", start, end)
    inputs.inputs["trace spans"] = f"{logs_dir / 'spans'} ({len(inputs.spans)} spans)"


def _read_agent_events(inputs: Inputs, run_dir: Path, job: str | None) -> None:
    start, end = inputs.window
    for events_file in sorted(run_dir.glob("nodes/*/agent/events.jsonl")):
        inputs.agent_events += [
            e
            for e in read_agent_events(events_file)
            if start <= e.time <= end and (job is None or e.job == job)
        ]
    inputs.agent_events.sort(key=lambda e: e.time)
    inputs.inputs["agent events"] = (
        f"{run_dir}/nodes/*/agent/events.jsonl ({len(inputs.agent_events)} in the window)"
    )


def _read_journals(inputs: Inputs, run_dir: Path, job: str | None) -> None:
    """The chaos journals whose run overlaps the window, of the incident's ``job`` (one that
    ran against another training job faulted a rank of that job, not of this one: on a
    shared cluster it would name a culprit for the wrong incident); a journal without a
    job (a node-level experiment) is kept."""
    start, end = inputs.window
    other = 0
    for path in sorted(run_dir.glob("experiments/*/journal.json")):
        try:
            journal = load_journal(path)
        except (OSError, ValidationError) as exc:  # being written, or of another version
            log.info("journal %s skipped: %s", path, exc)
            continue
        ended = journal.ended_at or end
        if not (journal.started_at <= end and ended >= start):
            continue
        if job is not None and journal.job is not None and journal.job.name != job:
            other += 1
            continue
        inputs.journals.append(journal)
    also = f"; {other} of other jobs left out" if other else ""
    inputs.inputs["chaos journals"] = (
        f"{run_dir}/experiments ({len(inputs.journals)} overlapping{also})"
    )


def _read_slurm(inputs: Inputs, slurm: SlurmCommands, job: str | None) -> None:
    """Slurm's events of the job (by name) and of the nodes, inside the window."""
    if job is None:
        inputs.inputs["slurm"] = "not read (the incident has no job label)"
        return
    try:
        history = read_slurm_history(slurm, job)
    except BackendError as exc:  # e.g. the lab is down: scontrol's munge errors, 4 lines
        lines = str(exc).splitlines() or [""]
        more = f" (+{len(lines) - 1} more lines in the report's inputs)" if len(lines) > 1 else ""
        log.warning("post-mortem: Slurm not read (is slurmctld up?): %s%s", lines[0], more)
        inputs.inputs["slurm"] = f"none: {exc}"
        return
    start, end = inputs.window
    inputs.slurm_events = [e for e in history.events if start <= e.at <= end]
    inputs.inputs["slurm"] = f"{history.what} ({len(inputs.slurm_events)} events in the window)"


def gather(
    incident: IncidentRecord,
    actions: list[ActionRecord],
    audit: list[AuditEntry],
    *,
    now: float,
    lab_run_dir: Path | None,
    prometheus_url: str | None,
    prometheus_http: HttpOptions | None = None,
    slurm: SlurmCommands | None = None,
) -> Inputs:
    """Collect everything about ``incident`` (never raises for a missing source);
    ``prometheus_http``: how to reach Prometheus (TLS, auth); ``slurm``: the cluster's
    command client when the responder's platform is ``slurm``."""
    window = incident_window(incident, now)
    inputs = Inputs(incident=incident, actions=actions, audit=audit, window=window)
    inputs.inputs["responder"] = (
        f"{len(actions)} actions, {len(audit)} audit entries, {len(incident.members)} alerts"
    )
    job = incident_job(incident)
    if lab_run_dir is not None:
        run_dir = Path(lab_run_dir)
        inputs.rank_nodes = _lab_rank_nodes(run_dir)
        if job is not None:
            _read_job(inputs, run_dir / "jobs" / job / "logs", since=window[0])
        _read_agent_events(inputs, run_dir, job)
        _read_journals(inputs, run_dir, job)
    else:
        inputs.inputs["lab"] = "none: no lab run directory (--lab-run-dir)"
    if not prometheus_url:
        inputs.inputs["prometheus"] = "none: no Prometheus URL (--prometheus-url)"
    elif job is None:
        inputs.inputs["prometheus"] = (
            f"{prometheus_url}: not queried (the incident has no job label)"
        )
    else:
        found = read_prometheus(prometheus_url, job, window, options=prometheus_http)
        inputs.prometheus, inputs.prometheus_now = found.ranges, found.instants
        inputs.inputs["prometheus"] = found.what
    if slurm is not None:
        _read_slurm(inputs, slurm, job)
    return inputs


__all__ = [
    "Inputs",
    "Span",
    "gather",
    "incident_job",
    "incident_window",
    "read_spans",
]
