"""The incident's timeline rows, one function per source, merged by the engine.

Sources: chaos journals overlapping the incident, the last progress before the alert
(rank logs), the member alerts (Prometheus's ``startsAt``/``endsAt``), the responder's
incident, its audit log (or, without one, its actions), the agents' events, the
flight-recorder dumps, the restart and recovery (rank logs), trace spans worth a
line and, on Slurm, the scheduler's job transitions and node drain reasons. Chatty sources are capped (:func:`stormwatch.postmortem.timeline.capped`); rows
outside the incident's window are dropped (:func:`~stormwatch.postmortem.timeline.within`).
"""

from __future__ import annotations

import statistics

from stormwatch.agent.watch.events import AgentEvent
from stormwatch.alerts.incident_report.sources import Inputs, Span
from stormwatch.contracts.journal import Journal
from stormwatch.postmortem import IncidentPostMortem, Restart, TimelineEvent
from stormwatch.postmortem.text import alert_label, format_clock
from stormwatch.postmortem.timeline import WINDOW_SLACK_SECONDS, capped, within

#: A step span this many times its median (and over a second) is worth a line.
SLOW_SPAN_FACTOR = 5.0


def _journal_rows(journal: Journal) -> list[TimelineEvent]:
    rows = [
        TimelineEvent(
            at=journal.started_at,
            event="chaos experiment started",
            source="chaos journal",
            detail=journal.title,
        )
    ]
    for record in journal.method + journal.rollbacks:
        fault = record.fault_injected()
        if fault is not None:
            rows.append(
                TimelineEvent(
                    at=fault.applied_at,
                    event="fault injected",
                    source="chaos journal",
                    detail=f"{fault.kind} rank {fault.rank}",
                )
            )
        elif record.type == "revert" and record.end is not None:
            rows.append(
                TimelineEvent(
                    at=record.end,
                    event="fault reverted",
                    source="chaos journal",
                    detail=record.name,
                )
            )
    if journal.ended_at is not None:
        rows.append(
            TimelineEvent(
                at=journal.ended_at,
                event="chaos experiment ended",
                source="chaos journal",
                detail=journal.status,
            )
        )
    return rows


def _alert_rows(inputs: Inputs) -> list[TimelineEvent]:
    rows = []
    for member in inputs.incident.members:
        name = alert_label(member.alertname, member.labels)
        rows.append(
            TimelineEvent(
                at=member.starts_at, event="alert firing", source="prometheus", detail=name
            )
        )
        if member.ends_at is not None:
            rows.append(
                TimelineEvent(
                    at=member.ends_at, event="alert resolved", source="prometheus", detail=name
                )
            )
    return rows


def _responder_rows(inputs: Inputs) -> list[TimelineEvent]:
    incident = inputs.incident
    rows = [
        TimelineEvent(
            at=incident.opened_at,
            event=f"incident {incident.id} opened",
            source="responder",
            # the alert group's labels, not Alertmanager's group key (its route's matchers)
            detail=", ".join(f"{k}={v}" for k, v in sorted(incident.group_labels.items()))
            or incident.alertname,
        )
    ]
    if incident.closed_at is not None:
        rows.append(
            TimelineEvent(
                at=incident.closed_at, event=f"incident {incident.id} closed", source="responder"
            )
        )
    return rows


def _action_rows(inputs: Inputs) -> list[TimelineEvent]:
    """The audit log's entries; without any (an unguarded runner), each action's start and end."""
    rows = [
        TimelineEvent(
            at=e.time,
            event=f"action {e.kind}: {e.event}",
            source=f"audit ({e.actor})",
            detail=e.reason,
        )
        for e in inputs.audit
    ]
    if rows:
        return rows
    for action in inputs.actions:
        rows.append(
            TimelineEvent(
                at=action.started_at, event=f"action {action.kind} started", source="responder"
            )
        )
        rows.append(
            TimelineEvent(
                at=action.finished_at,
                event=f"action {action.kind}: {action.status}",
                source="responder",
                detail=action.detail,
            )
        )
    return rows


def _agent_detail(event: AgentEvent) -> str:
    """The event's own keys, floats to 4 significant digits (``0.1924``), at most 160 characters."""
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in event.details().items()
    )[:160]


def _agent_rows(inputs: Inputs) -> list[TimelineEvent]:
    return [
        TimelineEvent(
            at=e.time, event=f"agent: {e.kind}", source=f"agent {e.node}", detail=_agent_detail(e)
        )
        for e in inputs.agent_events
    ]


def _recovery_rows(pm: IncidentPostMortem, restart: Restart) -> list[TimelineEvent]:
    """The dumps written, the workers' restart and the first step after it."""
    rows = [
        TimelineEvent(
            at=dump.time,
            event=f"rank {dump.rank} wrote a dump",
            source="trainer",
            detail=dump.reason if len(dump.reason) <= 160 else dump.reason[:159] + "…",
        )
        for dump in pm.dumps
    ]
    if restart.starts:
        rows.append(
            TimelineEvent(
                at=restart.starts[0].time,
                # the start record: written once the checkpoint is loaded, not at process start
                event="restarted workers began training",
                source="rank logs",
                detail=f"{len(restart.starts)} worker starts, resuming from step "
                f"{pm.impact.resumed_from_step}",
            )
        )
    if pm.recovered_at is not None:
        rows.append(
            TimelineEvent(at=pm.recovered_at, event="first step after resume", source="rank logs")
        )
    return rows


def _span_rows(inputs: Inputs) -> list[TimelineEvent]:
    """Spans worth a line: errors, spans 5x slower than their median (and over a second),
    and the checkpoint loads and saves of the lowest rank that has such spans.

    A span that ended in an error is placed at its end, when the error was raised: at its
    start, a step killed mid-way read as failing before the fault that killed it. One that
    ended after the window (a collective that timed out long after the incident closed) is
    placed at its start (at the window's start when it began before it), with when it
    ended, rather than dropped with the rows past the window (breaker's finding)."""
    by_name: dict[str, list[float]] = {}
    for span in inputs.spans:
        by_name.setdefault(span.name, []).append(span.end - span.start)
    medians = {name: statistics.median(d) for name, d in by_name.items()}
    # routine checkpoint spans of one rank: every rank's are the same moments (fresh user:
    # 16 rows before the fault)
    first = min(
        (s.rank for s in inputs.spans if s.rank is not None and s.name.startswith("checkpoint")),
        default=None,
    )
    rows = []
    for span in sorted(inputs.spans, key=lambda s: s.start):
        seconds = span.end - span.start
        slow = seconds > SLOW_SPAN_FACTOR * medians[span.name] and seconds > 1.0
        routine = span.name.startswith("checkpoint") and span.rank == first
        if span.error or routine or slow:
            what = "error" if span.error else ("slow" if slow else "span")
            of_step = f" of step {span.step}" if span.step is not None else ""
            at, detail = _span_place(span, inputs.window)
            rows.append(
                TimelineEvent(
                    at=at,
                    event=f"trace: {span.name}{of_step} ({what})",
                    source=f"trace rank {span.rank}",
                    detail=detail,
                )
            )
    return rows


def _span_place(span: Span, window: tuple[float, float]) -> tuple[float, str]:
    """Where a span's row goes and its detail (see :func:`_span_rows`)."""
    start, end = window
    seconds = span.end - span.start
    if not span.error:
        return span.start, f"{seconds:.2f} s"
    detail = f"ended in an error after {seconds:.2f} s"
    if span.end <= end + WINDOW_SLACK_SECONDS:  # kept by the timeline's window
        return span.end, detail
    ended = f"{detail}, at {format_clock(span.end)}, after the window"
    if span.start < start:  # it spans the whole window: shown at the window's start
        return start, f"began at {format_clock(span.start)}, before the window; {ended}"
    return span.start, f"began here; {ended}"


def _slurm_rows(inputs: Inputs) -> list[TimelineEvent]:
    """Slurm's job transitions (submitted, requeued, started, ended) and node reasons."""
    return [
        TimelineEvent(
            at=e.at, event=f"slurm: {e.subject} {e.event}", source="slurm", detail=e.detail
        )
        for e in inputs.slurm_events
    ]


def incident_timeline(
    inputs: Inputs, pm: IncidentPostMortem, restart: Restart
) -> list[TimelineEvent]:
    """Every source's rows inside the incident's window, by time (notes say what was capped)."""
    rows = [row for journal in inputs.journals for row in _journal_rows(journal)]
    if pm.onset_source == "last progress" and pm.onset_at is not None:
        rows.append(
            TimelineEvent(
                at=pm.onset_at,
                event="last progress before the alert",
                source="rank logs",
                detail=f"step {pm.impact.last_step_before}",
            )
        )
    rows += capped(_alert_rows(inputs), "alert", pm.notes)
    rows += _responder_rows(inputs)
    rows += capped(_action_rows(inputs), "audit", pm.notes)
    rows += capped(_agent_rows(inputs), "agent", pm.notes)
    rows += _recovery_rows(pm, restart)
    rows += capped(_span_rows(inputs), "trace span", pm.notes)
    rows += capped(_slurm_rows(inputs), "slurm", pm.notes)
    return within(rows, *inputs.window)


__all__ = ["incident_timeline"]
