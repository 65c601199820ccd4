"""What an incident post-mortem reads: the responder's records, the lab's files, Prometheus.

:func:`gather` collects everything once into :class:`Inputs`; a missing or
unreadable source leaves its part empty and says why in ``Inputs.inputs``
(never raises for a source). Lab layout (docs/ARCHITECTURE.md):

* ``<run>/jobs/<job>/logs/rank<R>.jsonl``: the trainer's rank logs (steps, restarts);
* ``<run>/jobs/<job>/logs/dumps/rank<R>.json``: per-rank flight-recorder dumps;
* ``<run>/jobs/<job>/logs/spans/rank<R>.jsonl``: trace spans (OpenTelemetry JSON lines);
* ``<run>/nodes/<node>/agent/events.jsonl``: the agents' rank events;
* ``<run>/experiments/<id>/journal.json``: chaos journals;
* ``<run>/lab.json``: nodes and ranks per node.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stormwatch.agent.watch.events import AgentEvent, read_agent_events
from stormwatch.alerts.responder.audit import AuditEntry
from stormwatch.contracts.journal import Journal, load_journal
from stormwatch.contracts.responder import ActionRecord, IncidentRecord
from stormwatch.lab.errors import LabError
from stormwatch.lab.state import load_lab_state
from stormwatch.trainer.telemetry.ranklogs import RankLog, read_job_logs

log = logging.getLogger(__name__)

#: Seconds of context plotted and read before the onset and after the close.
CONTEXT_BEFORE_S = 120.0
CONTEXT_AFTER_S = 30.0
#: Most points per Prometheus range query (the step is widened to stay below it).
MAX_POINTS = 400


@dataclass(frozen=True)
class Span:
    """One trace span: ``name`` on ``rank`` from ``start`` to ``end`` (Unix s)."""

    name: str
    rank: int | None
    start: float
    end: float
    error: bool


@dataclass
class Inputs:
    """Everything one post-mortem is built from (see the module docstring)."""

    incident: IncidentRecord
    actions: list[ActionRecord]
    audit: list[AuditEntry]
    window: tuple[float, float]
    rank_logs: dict[int, RankLog] = field(default_factory=dict)
    dumps: dict[int, dict[str, Any]] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    agent_events: list[AgentEvent] = field(default_factory=list)
    journals: list[Journal] = field(default_factory=list)
    rank_nodes: dict[int, str] = field(default_factory=dict)
    #: name -> {series label text -> [(t, value)]} from Prometheus range queries.
    prometheus: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    #: name -> {series label text -> value} from instant queries at the window's end.
    prometheus_now: dict[str, dict[str, float]] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)


def incident_job(incident: IncidentRecord) -> str | None:
    """The incident's training job (its or its first alert's ``job`` label)."""
    return incident.labels.get("job") or incident.first_alert.labels.get("job")


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
            spans.append(
                Span(
                    name=str(item.get("name", "?")),
                    rank=rank if isinstance(rank, int) else None,
                    start=begin,
                    end=finish,
                    error=status == "ERROR",
                )
            )
    return spans


def read_dumps(dump_dir: Path, since: float) -> dict[int, dict[str, Any]]:
    """Per-rank dumps (``rank<R>.json``) written at or after ``since`` (Unix s)."""
    dumps: dict[int, dict[str, Any]] = {}
    for path in sorted(dump_dir.glob("rank*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("dump %s unreadable: %s", path, exc)
            continue
        if not isinstance(data, dict) or not isinstance(data.get("rank"), int):
            continue
        if float(data.get("time") or 0.0) >= since:
            dumps[data["rank"]] = data
    return dumps


def _lab_rank_nodes(run_dir: Path) -> dict[int, str]:
    """rank -> node from ``lab.json`` (torchrun places ranks node by node); empty without one."""
    try:
        state = load_lab_state(run_dir)
    except LabError as exc:
        log.warning("%s", exc)
        return {}
    if state is None:
        return {}
    per_node = state.config.nproc_per_node
    names = [node.name for node in state.nodes]
    return {i * per_node + local: name for i, name in enumerate(names) for local in range(per_node)}


def _read_lab(inputs: Inputs, run_dir: Path, job: str | None, since: float) -> None:
    start, end = inputs.window
    inputs.rank_nodes = _lab_rank_nodes(run_dir)
    if job is not None:
        logs_dir = run_dir / "jobs" / job / "logs"
        if logs_dir.is_dir():
            inputs.rank_logs = read_job_logs(logs_dir)
            inputs.inputs["rank logs"] = f"{logs_dir} ({len(inputs.rank_logs)} ranks)"
            inputs.dumps = read_dumps(logs_dir / "dumps", since)
            inputs.inputs["flight-recorder dumps"] = (
                f"{logs_dir / 'dumps'} ({len(inputs.dumps)} written since the onset)"
            )
            inputs.spans = read_spans(logs_dir / "spans", start, end)
            inputs.inputs["trace spans"] = f"{logs_dir / 'spans'} ({len(inputs.spans)} spans)"
        else:
            inputs.inputs["rank logs"] = f"none: {logs_dir} does not exist"
    for events_file in sorted(run_dir.glob("nodes/*/agent/events.jsonl")):
        found = [
            e
            for e in read_agent_events(events_file)
            if start <= e.time <= end and (job is None or e.job == job)
        ]
        inputs.agent_events += found
    inputs.agent_events.sort(key=lambda e: e.time)
    inputs.inputs["agent events"] = (
        f"{run_dir}/nodes/*/agent/events.jsonl ({len(inputs.agent_events)} in the window)"
    )
    for path in sorted(run_dir.glob("experiments/*/journal.json")):
        try:
            journal = load_journal(path)
        except Exception as exc:  # a journal being written, or of another version
            log.info("journal %s skipped: %s", path, exc)
            continue
        ended = journal.ended_at or end
        if journal.started_at <= end and ended >= start:
            inputs.journals.append(journal)
    inputs.inputs["chaos journals"] = f"{run_dir}/experiments ({len(inputs.journals)} overlapping)"


def _label_text(labels: dict[str, str], keys: tuple[str, ...]) -> str:
    return " ".join(f"{k}={labels[k]}" for k in keys if k in labels) or "all"


#: name -> (PromQL with {job}, label keys naming a series).
RANGE_QUERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "step_seconds": (
        'max by (rank) (rate(stormwatch_train_step_duration_seconds_sum{{job="{job}"}}[15s])'
        ' / rate(stormwatch_train_step_duration_seconds_count{{job="{job}"}}[15s]))',
        ("rank",),
    ),
    # From the counter, not the last-step gauge: a hung job keeps its gauge at the
    # last step's rate, while the counter's rate falls to zero.
    "tokens_per_second": (
        'sum(rate(stormwatch_train_tokens_total{{job="{job}"}}[10s]))',
        (),
    ),
    "heartbeat_age_seconds": (
        'time() - max by (rank) (stormwatch_rank_last_progress_timestamp_seconds{{job="{job}"}})',
        ("rank",),
    ),
}
#: name -> (PromQL with {job} and {window} (seconds), label keys), evaluated at the end.
INSTANT_QUERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "straggler_score": (
        'max by (rank) (max_over_time(stormwatch_rank_straggler_score{{job="{job}"}}[{window}s]))',
        ("rank",),
    ),
    "xid_errors": (
        "sum by (node, gpu, code) (increase(stormwatch_gpu_xid_errors_total[{window}s])) > 0",
        ("node", "gpu", "code"),
    ),
}


def _read_prometheus(inputs: Inputs, url: str, job: str | None) -> None:
    from stormwatch.clients import PrometheusClient

    start, end = inputs.window
    if job is None:
        inputs.inputs["prometheus"] = f"{url}: not queried (the incident has no job label)"
        return
    client = PrometheusClient(url, timeout=5.0)
    step = max(1.0, (end - start) / MAX_POINTS)
    window = max(1, int(end - start))
    try:
        for name, (expr, keys) in RANGE_QUERIES.items():
            series = client.query_range(expr.format(job=job), start=start, end=end, step=step)
            inputs.prometheus[name] = {
                _label_text(dict(s.labels), keys): [(t, v) for t, v in s.points] for s in series
            }
        for name, (expr, keys) in INSTANT_QUERIES.items():
            samples = client.query(expr.format(job=job, window=window), at=end)
            inputs.prometheus_now[name] = {
                _label_text(dict(s.labels), keys): s.value for s in samples
            }
    except Exception as exc:  # any failure: plots fall back to the rank logs
        inputs.inputs["prometheus"] = f"{url}: {exc}"
        inputs.prometheus.clear()
        return
    inputs.inputs["prometheus"] = f"{url} (range {step:g} s steps)"


def gather(
    incident: IncidentRecord,
    actions: list[ActionRecord],
    audit: list[AuditEntry],
    *,
    now: float,
    lab_run_dir: Path | None,
    prometheus_url: str | None,
) -> Inputs:
    """Collect everything about ``incident`` (never raises for a missing source)."""
    window = incident_window(incident, now)
    inputs = Inputs(incident=incident, actions=actions, audit=audit, window=window)
    inputs.inputs["responder"] = (
        f"{len(actions)} actions, {len(audit)} audit entries, {len(incident.members)} alerts"
    )
    job = incident_job(incident)
    if lab_run_dir is not None:
        _read_lab(inputs, Path(lab_run_dir), job, since=window[0])
    else:
        inputs.inputs["lab"] = "none: no lab run directory (--lab-run-dir)"
    if prometheus_url:
        _read_prometheus(inputs, prometheus_url, job)
    else:
        inputs.inputs["prometheus"] = "none: no Prometheus URL (--prometheus-url)"
    return inputs


__all__ = [
    "INSTANT_QUERIES",
    "RANGE_QUERIES",
    "Inputs",
    "Span",
    "gather",
    "incident_job",
    "incident_window",
    "read_dumps",
    "read_spans",
]
