"""Assemble the incident post-mortem: onset, detection, recovery, impact, culprit, timeline.

Definitions (Unix seconds; see :class:`stormwatch.postmortem.IncidentPostMortem`):

* onset: the fault time of a chaos journal covering the job (``applied_at``)
  within :data:`JOURNAL_MATCH_S` before the first alert; else the last step any rank
  completed before the first alert (the last progress); else the first alert itself.
* detected: the first member alert's ``startsAt`` (when Prometheus fired it).
* restarted / recovered: the first ``start`` / ``step`` of a worker incarnation
  started after the onset (rank logs); the restart's cause is the nodes its start names
  and, on each, the first rank the agent saw exit (:func:`~stormwatch.postmortem.causes.failed_ranks`).
* restart failure: ``port conflict on restart`` when a dump written after the onset
  records errno ``EADDRINUSE`` (:func:`~stormwatch.postmortem.causes.restart_failure`).

The arithmetic (time to detect and recover, impact) and the culprit are the engine's
(:mod:`stormwatch.postmortem`); this module decides the onset and assembles the record.
"""

from __future__ import annotations

from stormwatch.alerts.incident_report.clues import clues_of, reduce_dump, stop_started_at
from stormwatch.alerts.incident_report.sources import Inputs, incident_job
from stormwatch.alerts.incident_report.timeline_rows import incident_timeline
from stormwatch.alerts.policy import RESTART_KINDS
from stormwatch.postmortem import (
    DUMP_LEAD_S,
    IncidentPostMortem,
    compare_dumps,
    elapsed,
    find_culprit,
    incident_dumps,
    measure_impact,
    restart_after,
)
from stormwatch.postmortem.causes import failed_ranks, restart_failure
from stormwatch.postmortem.text import alert_label

#: A chaos fault this long before the first alert still counts as its onset (s).
JOURNAL_MATCH_S = 600.0


def _onset(inputs: Inputs, pm: IncidentPostMortem) -> None:
    first = inputs.incident.starts_at
    for journal in inputs.journals:
        if pm.job is not None and journal.job is not None and journal.job.name != pm.job:
            continue
        for fault in journal.injected_faults():
            if first - JOURNAL_MATCH_S <= fault.applied_at <= first:
                pm.onset_at, pm.onset_source = fault.applied_at, "chaos journal"
                return
    steps = [s.time for rank in inputs.progress.values() for s in rank.steps if s.time <= first]
    if steps:
        pm.onset_at, pm.onset_source = max(steps), "last progress"
    else:
        pm.onset_at, pm.onset_source = first, "first alert"


def build(inputs: Inputs, *, now: float) -> IncidentPostMortem:
    """The post-mortem of ``inputs.incident`` (never raises for missing pieces: see ``notes``)."""
    incident = inputs.incident
    pm = IncidentPostMortem(
        incident_id=incident.id,
        alertname=incident.alertname,
        job=incident_job(incident),
        group_key=incident.group_key,
        status=incident.status,
        alerts=[alert_label(m.alertname, m.labels) for m in incident.members],
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
    pm.restart_action_at = min(
        (
            a.finished_at
            for a in inputs.actions
            if a.kind in RESTART_KINDS and a.status == "succeeded" and a.finished_at is not None
        ),
        default=None,
    )
    pm.time_to_detect_seconds = elapsed(pm.onset_at, pm.detected_at)
    restart = restart_after(inputs.progress, pm.onset_at)
    pm.restarted_at = restart.started_at
    if restart.first_step is not None:
        pm.recovered_at = restart.first_step.time
        pm.time_to_recover_seconds = elapsed(pm.onset_at, pm.recovered_at)
    pm.dumps = compare_dumps(
        incident_dumps(
            (reduce_dump(d) for d in inputs.all_dumps),
            since=None if pm.onset_at is None else pm.onset_at - DUMP_LEAD_S,
            stopped_at=stop_started_at(inputs),
        )
    )
    clues = clues_of(inputs, pm.dumps, pm.onset_at)
    pm.impact = measure_impact(
        inputs.progress,
        restart,
        onset=pm.onset_at,
        resolved_at=pm.resolved_at,
        failed_ranks=failed_ranks(restart, clues.rank_exits, since=pm.onset_at),
    )
    # every attempt's dumps: a restart that failed on a port may have been followed by others
    pm.restart_failure = restart_failure(
        (reduce_dump(d) for d in inputs.all_dumps), since=pm.onset_at
    )
    pm.straggler_scores = inputs.prometheus_now.get("straggler_score", {})
    pm.xid_errors = inputs.prometheus_now.get("xid_errors", {})
    pm.culprit = find_culprit(clues)
    pm.timeline = incident_timeline(inputs, pm, restart)
    _notes(inputs, pm)
    pm.summary = _summary(pm)
    return pm


def _notes(inputs: Inputs, pm: IncidentPostMortem) -> None:
    if pm.status != "closed":
        pm.notes.append("the incident is still open: times and impact are provisional")
    if not inputs.progress:
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
        + ")"
        + (f", hung in {pm.culprit.phase}." if pm.culprit.phase else ".")
    ]
    if pm.restart_failure is not None:
        parts[0] += f" A restart failed: {pm.restart_failure.cause}."
    if pm.time_to_detect_seconds is not None:
        parts.append(f"Detected {_seconds(pm.time_to_detect_seconds)} after the onset")
    if pm.time_to_recover_seconds is not None:
        parts.append(f"recovered after {_seconds(pm.time_to_recover_seconds)}")
    impact = pm.impact
    if impact.steps_lost is not None:
        parts.append(f"{impact.steps_lost} steps lost")
    if impact.gpu_hours_lost is not None:
        parts.append(f"{impact.gpu_hours_lost:.4f} GPU-hours lost")
    return parts[0] + (" " + "; ".join(parts[1:]) + "." if len(parts) > 1 else "")


def _seconds(value: float) -> str:
    """``0.2 s``, ``9.3 s``, ``42 s``: tenths below 10 s, so a sub-second detection does not
    read "0 s" beside the table's 0.2 s."""
    return f"{value:.1f} s" if abs(value) < 10 else f"{value:.0f} s"


__all__ = ["JOURNAL_MATCH_S", "build"]
