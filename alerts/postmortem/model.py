"""The incident post-mortem as data (``postmortem.json``): what happened, its cost, who did it.

Times are Unix seconds; durations are seconds; ``None`` means "not observed"
(the reason is in :attr:`IncidentPostMortem.notes`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.chaos.reports.postmortem import TimelineEvent


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Impact(_Model):
    """What the incident cost the job.

    Attributes:
        world_size: ranks of the job (rank logs, else Prometheus).
        last_step_before: last step completed before the workers restarted.
        resumed_from_step: checkpoint step the restarted workers resumed from.
        steps_lost: ``last_step_before - resumed_from_step`` (computed again).
        median_step_seconds: median step time before the onset (rank logs).
        time_lost_seconds: onset -> the job completes ``last_step_before`` again
            (when it did); else onset -> first step after resume plus
            ``steps_lost x median_step_seconds``.
        gpu_hours_lost: ``world_size x time_lost_seconds / 3600`` (every rank
            holds a GPU for the whole outage; ETTR accounting as in Meta's
            "Revisiting reliability in large-scale ML research clusters", 2024).
        goodput: share of the incident's wall time (onset -> incident closed)
            spent on new steps: ``new steps x median_step_seconds / duration``, 0..1.
    """

    world_size: int | None = None
    last_step_before: int | None = None
    resumed_from_step: int | None = None
    steps_lost: int | None = None
    median_step_seconds: float | None = None
    time_lost_seconds: float | None = None
    gpu_hours_lost: float | None = None
    goodput: float | None = None


class RankDump(_Model):
    """One rank's flight-recorder dump, reduced to what names a culprit.

    Attributes:
        rank / attempt / time / reason / step: from the trainer's dump file.
        enqueued: process group (``name ranks``) -> last enqueued collective seq.
        behind: groups where this rank enqueued fewer collectives than a peer, with
            how many fewer.
        in_flight: the rank was inside a collective (enqueued but never completed,
            or a collective of our own record with no completion time).
    """

    rank: int
    attempt: int | None = None
    time: float | None = None
    reason: str = ""
    step: int | None = None
    enqueued: dict[str, int] = Field(default_factory=dict)
    behind: dict[str, int] = Field(default_factory=dict)
    in_flight: bool = False


class Culprit(_Model):
    """The likely cause: a rank and/or node, how it was found and the evidence.

    Attributes:
        rank / node: None when unknown.
        method: ``flight_recorder``, ``rank_exit``, ``alert``, ``straggler``,
            ``heartbeat``, ``xid`` (strongest first), or ``unknown``.
        certain: False when several candidates were equally likely.
        evidence: human-readable lines, strongest first.
        chaos_fault_rank: the rank a chaos experiment faulted, when a journal
            covers the incident (a cross-check; never used to name the culprit).
    """

    rank: int | None = None
    node: str | None = None
    method: Literal[
        "flight_recorder", "rank_exit", "alert", "straggler", "heartbeat", "xid", "unknown"
    ] = "unknown"
    certain: bool = False
    evidence: list[str] = Field(default_factory=list)
    chaos_fault_rank: int | None = None


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
        onset_source: which of the two.
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
    onset_source: Literal["chaos journal", "last progress", "first alert"] | None = None
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
    actions: list[str] = Field(default_factory=list)
    dumps: list[RankDump] = Field(default_factory=list)
    straggler_scores: dict[str, float] = Field(default_factory=dict)
    xid_errors: dict[str, float] = Field(default_factory=dict)
    timeline: list[TimelineEvent] = Field(default_factory=list)
    plots: list[PlotRef] = Field(default_factory=list)
    inputs: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    written_at: float = 0.0


__all__ = ["Culprit", "Impact", "IncidentPostMortem", "PlotRef", "RankDump"]
