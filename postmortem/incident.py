"""The post-mortem of a responder incident (``incident-<id>/postmortem.json``) and its layout.

:class:`IncidentPostMortem` is the record the incident source
(:mod:`stormwatch.alerts.incident_report`) fills from the responder's records, the
alerts, the agents' events, the flight-recorder dumps, spans, rank logs and any chaos
journal covering the incident; :func:`incident_document` lays it out: the summary,
Summary, Likely culprit, Timeline, Plots, Alerts, Inputs, Notes. Times are Unix
seconds; durations seconds; ``None`` means "not observed" (the reason is in ``notes``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.postmortem.causes import RestartFailure
from stormwatch.postmortem.clues import Culprit, RankDump
from stormwatch.postmortem.document import Bullets, Document, Figure, KeyValues, Paragraph, Section
from stormwatch.postmortem.measures import Impact
from stormwatch.postmortem.text import MISSING, format_clock, format_optional, format_seconds
from stormwatch.postmortem.timeline import TimelineEvent, timeline_table

OnsetSource = Literal["chaos journal", "last progress", "first alert"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlotRef(_Model):
    """A plot written next to the post-mortem (``file`` is relative to its folder)."""

    name: str
    title: str
    file: str
    source: Literal["prometheus", "rank logs"]


class IncidentPostMortem(_Model):
    """The post-mortem of one responder incident (``postmortem.json``).

    Attributes:
        incident_id / alertname / job / group_key: the incident.
        summary: one paragraph for the top of the report.
        alerts: ``alertname{labels}`` of every member alert.
        onset_at: when the failure began: a chaos journal's fault time, else the
            last progress of any rank before the first alert fired.
        onset_source: which of the two (or the first alert itself, without rank logs).
        detected_at: the first alert's ``startsAt`` (Prometheus: when it fired).
        received_at: when the responder opened the incident.
        restart_action_at: when a responder restart action (``restart_workers``,
            ``exclude_node_restart``) succeeded.
        restarted_at: first worker start after the onset (rank logs).
        recovered_at: first step completed by a restarted worker.
        resolved_at: when the incident closed.
        time_to_detect_seconds: ``detected_at - onset_at`` (MTTD).
        time_to_recover_seconds: ``recovered_at - onset_at`` (MTTR).
        actions: ``kind: status (detail)`` of the responder's actions.
        restart_failure: why a restart itself failed (``port conflict on restart``: a
            rank's dump records errno ``EADDRINUSE``), None when none did.
        dumps: the flight-recorder dumps written during the incident.
        straggler_scores: rank -> highest ``stormwatch_rank_straggler_score`` in the window.
        xid_errors: ``node gpu code`` -> XID events in the window (Prometheus).
        inputs: source -> what was read (files, URLs) or why not.
    """

    incident_id: int
    alertname: str
    job: str | None = None
    group_key: str
    status: str
    summary: str = ""
    alerts: list[str] = Field(default_factory=list)
    onset_at: float | None = None
    onset_source: OnsetSource | None = None
    detected_at: float
    received_at: float
    restart_action_at: float | None = None
    restarted_at: float | None = None
    recovered_at: float | None = None
    resolved_at: float | None = None
    time_to_detect_seconds: float | None = None
    time_to_recover_seconds: float | None = None
    impact: Impact = Field(default_factory=Impact)
    culprit: Culprit = Field(default_factory=Culprit)
    restart_failure: RestartFailure | None = None
    actions: list[str] = Field(default_factory=list)
    dumps: list[RankDump] = Field(default_factory=list)
    straggler_scores: dict[str, float] = Field(default_factory=dict)
    xid_errors: dict[str, float] = Field(default_factory=dict)
    timeline: list[TimelineEvent] = Field(default_factory=list)
    plots: list[PlotRef] = Field(default_factory=list)
    inputs: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    written_at: float = 0.0


def summary_rows(pm: IncidentPostMortem) -> list[tuple[str, str]]:
    """(measure, value) rows of the Summary table."""
    impact, culprit = pm.impact, pm.culprit
    who = " / ".join(
        x for x in (f"rank {culprit.rank}" if culprit.rank is not None else None, culprit.node) if x
    )
    gpu_hours = (
        MISSING
        if impact.gpu_hours_lost is None
        else f"{impact.gpu_hours_lost:.4f} ({impact.world_size} ranks)"
    )
    return [
        ("incident", f"{pm.incident_id} ({pm.status}): {pm.alertname} on job {pm.job or MISSING}"),
        (
            "likely culprit",
            f"{who or 'unknown'} — {culprit.method.replace('_', ' ')}"
            + ("" if culprit.certain else " (uncertain)"),
        ),
        ("hung in (phase or start-up stage)", culprit.phase or MISSING),
        (
            "restart failure",
            pm.restart_failure.cause if pm.restart_failure is not None else "none seen",
        ),
        ("onset", f"{format_clock(pm.onset_at)} ({pm.onset_source or MISSING})"),
        ("time to detect (onset → alert firing)", format_seconds(pm.time_to_detect_seconds)),
        (
            "time to recover (onset → first step after resume)",
            format_seconds(pm.time_to_recover_seconds),
        ),
        ("restart count (job; node-local)", impact.restart or MISSING),
        ("last step before the restart", format_optional(impact.last_step_before)),
        ("resumed from step", format_optional(impact.resumed_from_step)),
        ("steps lost", format_optional(impact.steps_lost)),
        (  # more than the time to recover: the steps lost are computed again after it
            "time lost (onset → the job back at its last step before the restart)",
            format_seconds(impact.time_lost_seconds),
        ),
        ("GPU-hours lost (ranks x time lost)", gpu_hours),
        (
            "goodput during the incident (new steps x median step interval / onset → close)",
            MISSING if impact.goodput is None else f"{impact.goodput:.0%}",
        ),
        ("actions", "; ".join(pm.actions) or "none"),
    ]


def incident_document(pm: IncidentPostMortem) -> Document:
    """The incident's report: summary, Summary, Likely culprit, Timeline, Plots, Alerts,
    Inputs (and Notes); the HTML page ends with when it was written."""
    culprit = pm.culprit.evidence or ["no evidence"]
    if pm.culprit.chaos_fault_rank is not None:
        culprit = [
            *culprit,
            f"cross-check: the chaos journal faulted rank {pm.culprit.chaos_fault_rank}",
        ]
    plots = [
        Figure(p.file, title=p.title, caption=f"{p.title} ({p.source})", name=p.name)
        for p in pm.plots
    ]
    sections = [
        Section("Summary", [KeyValues(summary_rows(pm))]),
        Section("Likely culprit", [Bullets(culprit)]),
        *(
            [Section(f"Restart failed: {failure.cause}", [Bullets(failure.evidence)])]
            if (failure := pm.restart_failure) is not None
            else []
        ),
        Section("Timeline", [timeline_table(pm.timeline, pm.onset_at, "onset")]),
        Section("Plots", plots),
        Section("Alerts", [Bullets(pm.alerts)]),
        Section("Inputs", [Bullets([f"{k}: {v}" for k, v in pm.inputs.items()])]),
    ]
    if pm.notes:
        sections.append(Section("Notes", [Bullets(pm.notes)]))
    return Document(
        title=f"Post-mortem: incident {pm.incident_id}, {pm.alertname}",
        lead=[Paragraph(pm.summary, lead=True)],
        sections=sections,
        footer=f"written {format_clock(pm.written_at)}",
    )


__all__ = [
    "IncidentPostMortem",
    "OnsetSource",
    "PlotRef",
    "incident_document",
    "summary_rows",
]
