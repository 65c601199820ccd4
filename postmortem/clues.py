"""The neutral clues the culprit is named from, and the culprit itself.

The source adapters (:mod:`stormwatch.alerts.incident_report`, the node agent's hang
diagnosis, :mod:`stormwatch.chaos.reports.experiment_report`) reduce what they read to
these models; :mod:`.culprit` weighs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.postmortem.progress import JobProgress

Method = Literal[
    "flight_recorder", "rank_exit", "alert", "straggler", "heartbeat", "xid", "unknown"
]


class RankDump(BaseModel):
    """One rank's flight-recorder dump, reduced to what names a culprit.

    Attributes:
        rank / attempt / time / reason / step: from the trainer's dump file.
        errno: the errno of the failure that ended the attempt (98: ``EADDRINUSE``), if any.
        phase: the phase the rank was in (e.g. a start-up stage), from the dump file.
        enqueued: process group (``name ranks``) -> last enqueued collective seq.
        behind: groups where this rank enqueued fewer collectives than a peer, with
            how many fewer (:func:`compare_dumps`).
        completed: process group (``name ranks``) -> last completed collective seq.
        overtaken: groups where this rank is inside a collective that a peer has completed
            already (:func:`compare_dumps`): a victim's state, the collective is done but for
            a peer that stopped midway (a ring all-reduce completes on some ranks first).
        in_flight: the rank was inside a collective (enqueued but never completed,
            or a collective of our own record with no completion time).
    """

    model_config = ConfigDict(extra="forbid")

    rank: int
    attempt: int | None = None
    time: float | None = None
    reason: str = ""
    errno: int | None = None
    step: int | None = None
    phase: str | None = None
    enqueued: dict[str, int] = Field(default_factory=dict)
    behind: dict[str, int] = Field(default_factory=dict)
    completed: dict[str, int] = Field(default_factory=dict)
    overtaken: list[str] = Field(default_factory=list)
    in_flight: bool = False


class Culprit(BaseModel):
    """The likely cause: a rank and/or node, how it was found and the evidence.

    Attributes:
        rank / node: None when unknown.
        method: ``flight_recorder``, ``rank_exit``, ``alert``, ``straggler``,
            ``heartbeat``, ``xid`` (strongest first), or ``unknown``.
        certain: False when several candidates were equally likely.
        evidence: human-readable lines, strongest first.
        chaos_fault_rank: the rank a chaos experiment faulted, when a journal
            covers the incident (a cross-check; never used to name the culprit).
        phase: the phase the hang was stuck in (a start-up stage before the first
            step: ``rendezvous``, ``mesh``, ``parallelize``, ``checkpoint_load``), or None.
    """

    model_config = ConfigDict(extra="forbid")

    rank: int | None = None
    node: str | None = None
    method: Method = "unknown"
    certain: bool = False
    evidence: list[str] = Field(default_factory=list)
    chaos_fault_rank: int | None = None
    phase: str | None = None


@dataclass(frozen=True)
class RankHang:
    """A node agent found ``rank`` hung (its ``rank_hang`` event), inside ``phase`` past the
    phase's deadline (``None``: in no phase)."""

    time: float
    rank: int
    node: str
    phase: str | None = None


@dataclass(frozen=True)
class RankExit:
    """A rank's process ended uncleanly, as a node agent saw it (``how``: in words, e.g.
    ``was killed by SIGKILL``; ``killed``: by a signal it did not handle, as opposed to
    ending itself with an exit code, as a rank does when a collective fails under it)."""

    time: float
    rank: int
    node: str
    how: str
    killed: bool = False


@dataclass(frozen=True)
class HangDiagnosis:
    """A node agent named ``rank`` from its ranks' flight recorders while the hang was in
    progress (the agent's ``rank_hang_culprit`` event; :func:`culprit_from_dumps`)."""

    time: float
    rank: int
    node: str
    certain: bool
    evidence: Sequence[str] = ()


@dataclass(frozen=True)
class FirstAlert:
    """The alert that opened the incident (``tied``: another fired at the same moment)."""

    alertname: str
    labels: Mapping[str, str]
    tied: bool = False


@dataclass(frozen=True)
class Clues:
    """Everything the culprit is chosen from (times in Unix seconds).

    Attributes:
        progress: the job's rank progress (which ranks exist, their last steps).
        dumps: the flight-recorder dumps written during the incident, compared
            (:func:`compare_dumps`).
        first_alert / first_alert_at: the incident's first alert and when it fired.
        onset: when the failure began (None: unknown).
        rank_exits: unclean rank exits in the window, by time.
        hang_diagnoses: the node agents' culprits of the hang while it lasted, by time.
        straggler_scores: ``rank=R`` -> highest straggler score in the window.
        xid_errors: ``node=N gpu=G code=C`` -> XID events in the window.
        rank_nodes: rank -> node it ran on.
        chaos_fault_ranks: the ranks chaos journals covering the incident faulted, in order.
        stopped_at: when the responder began stopping the job's ranks (a restart), or None:
            the rank exits from then on are the remediation's, not clues to the cause.
        rank_hangs: the node agents' hang events in the window, by time.
    """

    progress: JobProgress
    dumps: Sequence[RankDump]
    first_alert: FirstAlert
    first_alert_at: float
    onset: float | None = None
    rank_exits: Sequence[RankExit] = ()
    hang_diagnoses: Sequence[HangDiagnosis] = ()
    straggler_scores: Mapping[str, float] = field(default_factory=dict)
    xid_errors: Mapping[str, float] = field(default_factory=dict)
    rank_nodes: Mapping[int, str] = field(default_factory=dict)
    chaos_fault_ranks: Sequence[int | None] = ()
    stopped_at: float | None = None
    rank_hangs: Sequence[RankHang] = ()


__all__ = [
    "Clues",
    "Culprit",
    "FirstAlert",
    "HangDiagnosis",
    "Method",
    "RankDump",
    "RankExit",
    "RankHang",
]
