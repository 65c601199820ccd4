"""Assemble the incident post-mortem: onset, detection, recovery, impact and the merged timeline.

Definitions (Unix seconds; see :class:`~.model.IncidentPostMortem`):

* onset: the fault time of a chaos journal covering the job (``applied_at``)
  within :data:`~.analysis.JOURNAL_MATCH_S` before the first alert; else the
  last step any rank completed before the first alert (the last progress);
  else the first alert itself.
* detected: the first member alert's ``startsAt`` (when Prometheus fired it).
* restarted / recovered: the first ``start`` / ``step`` of a worker
  incarnation started after the onset (rank logs).
"""

from __future__ import annotations

import statistics

from stormwatch.agent.watch.events import AgentEvent
from stormwatch.alerts.policy import RESTART_KINDS
from stormwatch.alerts.postmortem.analysis import (
    JOURNAL_MATCH_S,
    MAX_EVENTS_PER_SOURCE,
    _labels,
    compare_dumps,
    find_culprit,
    reduce_dump,
)
from stormwatch.alerts.postmortem.model import Impact, IncidentPostMortem
from stormwatch.alerts.postmortem.sources import Inputs, incident_job
from stormwatch.chaos.reports.postmortem import TimelineEvent
from stormwatch.trainer.telemetry.events import RankEvent, StartEvent, StepEvent


def _onset(inputs: Inputs, pm: IncidentPostMortem) -> None:
    first = inputs.incident.starts_at
    for journal in inputs.journals:
        if pm.job is not None and journal.job is not None and journal.job.name != pm.job:
            continue
        for fault in journal.injected_faults():
            if first - JOURNAL_MATCH_S <= fault.applied_at <= first:
                pm.onset_at, pm.onset_source = fault.applied_at, "chaos journal"
                return
    steps = [e.time for log in inputs.rank_logs.values() for e in log.steps if e.time <= first]
    if steps:
        pm.onset_at, pm.onset_source = max(steps), "last progress"
    else:
        pm.onset_at, pm.onset_source = first, "first alert"


def _restart(inputs: Inputs, pm: IncidentPostMortem) -> list[RankEvent]:
    """Fill restart/recovery times; returns every event after the restart (all ranks)."""
    onset = pm.onset_at
    if onset is None or not inputs.rank_logs:
        return []
    after = [e for log in inputs.rank_logs.values() for e in log.since_restart(onset)]
    after.sort(key=lambda e: e.time)
    starts = [e for e in after if isinstance(e, StartEvent)]
    steps = [e for e in after if isinstance(e, StepEvent)]
    if starts:
        pm.restarted_at = starts[0].time
        pm.impact.resumed_from_step = starts[0].resumed_from_step or 0
    if steps:
        pm.recovered_at = steps[0].time
        pm.time_to_recover_seconds = steps[0].time - onset
    return after


def _impact(inputs: Inputs, pm: IncidentPostMortem, after: list[RankEvent]) -> None:
    impact: Impact = pm.impact
    onset = pm.onset_at
    impact.world_size = len(inputs.rank_logs) or None
    if onset is None or not inputs.rank_logs:
        return
    cut = pm.restarted_at if pm.restarted_at is not None else onset
    before = [e for log in inputs.rank_logs.values() for e in log.steps if e.time <= cut]
    durations = [e.step_seconds for e in before if e.time <= onset and e.step_seconds]
    if durations:
        impact.median_step_seconds = statistics.median(durations[-200:])
    if before:
        impact.last_step_before = max(e.step or 0 for e in before)
    if impact.last_step_before is not None and impact.resumed_from_step is not None:
        impact.steps_lost = max(0, impact.last_step_before - impact.resumed_from_step)
    regained = [
        e.time
        for e in after
        if isinstance(e, StepEvent)
        and impact.last_step_before is not None
        and (e.step or 0) >= impact.last_step_before
    ]
    if regained:
        impact.time_lost_seconds = min(regained) - onset
    elif pm.recovered_at is not None and impact.median_step_seconds is not None:
        impact.time_lost_seconds = (pm.recovered_at - onset) + (
            impact.steps_lost or 0
        ) * impact.median_step_seconds
    if impact.time_lost_seconds is not None and impact.world_size:
        impact.gpu_hours_lost = impact.world_size * impact.time_lost_seconds / 3600.0
    end = pm.resolved_at
    if end is not None and end > onset and impact.median_step_seconds is not None:
        top = impact.last_step_before or 0
        new = {e.step for e in after if isinstance(e, StepEvent) and (e.step or 0) > top}
        impact.goodput = min(1.0, len(new) * impact.median_step_seconds / (end - onset))


def _capped(events: list[TimelineEvent], source: str, notes: list[str]) -> list[TimelineEvent]:
    if len(events) > MAX_EVENTS_PER_SOURCE:
        notes.append(
            f"timeline: {len(events) - MAX_EVENTS_PER_SOURCE} more {source} events left out"
        )
    return events[:MAX_EVENTS_PER_SOURCE]


def _timeline(inputs: Inputs, pm: IncidentPostMortem, after: list[RankEvent]) -> None:
    incident = inputs.incident
    start, end = inputs.window
    rows: list[TimelineEvent] = []
    for journal in inputs.journals:
        rows.append(
            TimelineEvent(
                at=journal.started_at,
                event="chaos experiment started",
                source="chaos journal",
                detail=journal.title,
            )
        )
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
    if pm.onset_source == "last progress" and pm.onset_at is not None:
        rows.append(
            TimelineEvent(
                at=pm.onset_at,
                event="last progress before the alert",
                source="rank logs",
                detail=f"step {pm.impact.last_step_before}",
            )
        )
    alerts = []
    for member in incident.members:
        name = f"{member.alertname}{_labels(member.labels)}"
        alerts.append(
            TimelineEvent(
                at=member.starts_at, event="alert firing", source="prometheus", detail=name
            )
        )
        if member.ends_at is not None:
            alerts.append(
                TimelineEvent(
                    at=member.ends_at, event="alert resolved", source="prometheus", detail=name
                )
            )
    rows += _capped(alerts, "alert", pm.notes)
    rows.append(
        TimelineEvent(
            at=incident.opened_at,
            event=f"incident {incident.id} opened",
            source="responder",
            detail=incident.group_key,
        )
    )
    if incident.closed_at is not None:
        rows.append(
            TimelineEvent(
                at=incident.closed_at, event=f"incident {incident.id} closed", source="responder"
            )
        )
    audit = [
        TimelineEvent(
            at=e.time,
            event=f"action {e.kind}: {e.event}",
            source=f"audit ({e.actor})",
            detail=e.reason,
        )
        for e in inputs.audit
    ]
    if not audit:  # no audit entries (unguarded runner): the actions table says it
        for action in inputs.actions:
            audit.append(
                TimelineEvent(
                    at=action.started_at, event=f"action {action.kind} started", source="responder"
                )
            )
            audit.append(
                TimelineEvent(
                    at=action.finished_at,
                    event=f"action {action.kind}: {action.status}",
                    source="responder",
                    detail=action.detail,
                )
            )
    rows += _capped(audit, "audit", pm.notes)
    agent = [
        TimelineEvent(
            at=e.time,
            event=f"agent: {e.kind}",
            source=f"agent {e.node}",
            detail=_agent_detail(e),
        )
        for e in inputs.agent_events
    ]
    rows += _capped(agent, "agent", pm.notes)
    for dump in pm.dumps:
        rows.append(
            TimelineEvent(
                at=dump.time,
                event=f"rank {dump.rank} wrote a dump",
                source="trainer",
                detail=dump.reason[:100],
            )
        )
    starts = [e for e in after if e.event == "start"]
    if starts:
        rows.append(
            TimelineEvent(
                at=starts[0].time,
                event="workers restarted",
                source="rank logs",
                detail=f"{len(starts)} worker starts, resuming from step "
                f"{pm.impact.resumed_from_step}",
            )
        )
    if pm.recovered_at is not None:
        rows.append(
            TimelineEvent(at=pm.recovered_at, event="first step after resume", source="rank logs")
        )
    rows += _capped(_span_rows(inputs), "trace span", pm.notes)
    kept = [r for r in rows if r.at is not None and start <= r.at <= end + 1.0]
    pm.timeline = sorted(kept, key=lambda r: r.at or 0.0)


def _agent_detail(event: AgentEvent) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in event.details().items())[:160]


def _short(value: object) -> str:
    """Floats to 4 significant digits (``0.1924``), the rest as they are."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _span_rows(inputs: Inputs) -> list[TimelineEvent]:
    """Spans worth a line: errors, checkpoint loads/saves, and steps 5x slower than their median."""
    medians: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for span in inputs.spans:
        by_name.setdefault(span.name, []).append(span.end - span.start)
    medians = {name: statistics.median(d) for name, d in by_name.items()}
    rows = []
    for span in sorted(inputs.spans, key=lambda s: s.start):
        seconds = span.end - span.start
        slow = seconds > 5 * medians[span.name] and seconds > 1.0
        if span.error or span.name.startswith("checkpoint") or slow:
            what = "error" if span.error else ("slow" if slow else "span")
            rows.append(
                TimelineEvent(
                    at=span.start,
                    event=f"trace: {span.name} ({what})",
                    source=f"trace rank {span.rank}",
                    detail=f"{seconds:.2f} s",
                )
            )
    return rows


def build(inputs: Inputs, *, now: float) -> IncidentPostMortem:
    """The post-mortem of ``inputs.incident`` (never raises for missing pieces: see ``notes``)."""
    incident = inputs.incident
    pm = IncidentPostMortem(
        incident_id=incident.id,
        alertname=incident.alertname,
        job=incident_job(incident),
        group_key=incident.group_key,
        status=incident.status,
        alerts=[f"{m.alertname}{_labels(m.labels)}" for m in incident.members],
        detected_at=incident.starts_at,
        received_at=incident.opened_at,
        resolved_at=incident.closed_at,
        actions=[
            f"{a.kind}: {a.status}" + (f" ({a.detail})" if a.detail else "") for a in inputs.actions
        ],
        inputs=dict(inputs.inputs),
        written_at=now,
    )
    _onset(inputs, pm)
    restarts = [
        a.finished_at
        for a in inputs.actions
        if a.kind in RESTART_KINDS and a.status == "succeeded" and a.finished_at is not None
    ]
    pm.restart_action_at = min(restarts, default=None)
    if pm.onset_at is not None:
        pm.time_to_detect_seconds = max(0.0, pm.detected_at - pm.onset_at)
    after = _restart(inputs, pm)
    _impact(inputs, pm, after)
    pm.dumps = compare_dumps(reduce_dump(d) for d in inputs.dumps.values())
    pm.straggler_scores = inputs.prometheus_now.get("straggler_score", {})
    pm.xid_errors = inputs.prometheus_now.get("xid_errors", {})
    pm.culprit = find_culprit(inputs, pm.dumps, pm.onset_at)
    _timeline(inputs, pm, after)
    _notes(inputs, pm)
    pm.summary = _summary(pm)
    return pm


def _notes(inputs: Inputs, pm: IncidentPostMortem) -> None:
    if pm.status != "closed":
        pm.notes.append("the incident is still open: times and impact are provisional")
    if not inputs.rank_logs:
        pm.notes.append("no rank logs: onset, recovery and impact are unknown")
    elif pm.restarted_at is None:
        pm.notes.append("no worker restart after the onset appears in the rank logs")
    elif pm.recovered_at is None:
        pm.notes.append("the workers restarted but completed no step afterwards")
    if not inputs.dumps:
        pm.notes.append("no flight-recorder dump was written during the incident")
    rank = pm.culprit.chaos_fault_rank
    if rank is not None and pm.culprit.rank is not None and rank != pm.culprit.rank:
        pm.notes.append(
            f"the chaos journal faulted rank {rank}, the evidence points at rank {pm.culprit.rank}"
        )


def _summary(pm: IncidentPostMortem) -> str:
    who = "an unknown rank"
    if pm.culprit.rank is not None:
        who = f"rank {pm.culprit.rank}" + (f" on {pm.culprit.node}" if pm.culprit.node else "")
    elif pm.culprit.node is not None:
        who = f"node {pm.culprit.node}"
    parts = [
        f"{pm.alertname} on job {pm.job or '?'}: likely culprit {who} "
        f"({pm.culprit.method.replace('_', ' ')}"
        + ("" if pm.culprit.certain else ", uncertain")
        + ")."
    ]
    if pm.time_to_detect_seconds is not None:
        parts.append(f"Detected {pm.time_to_detect_seconds:.0f} s after the onset")
    if pm.time_to_recover_seconds is not None:
        parts.append(f"recovered after {pm.time_to_recover_seconds:.0f} s")
    impact = pm.impact
    if impact.steps_lost is not None:
        parts.append(f"{impact.steps_lost} steps lost")
    if impact.gpu_hours_lost is not None:
        parts.append(f"{impact.gpu_hours_lost:.3f} GPU-hours lost")
    return parts[0] + (" " + "; ".join(parts[1:]) + "." if len(parts) > 1 else "")


__all__ = ["build"]
