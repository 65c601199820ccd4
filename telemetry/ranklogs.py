"""A job's rank logs read as a whole (``<job>/logs/rank<R>.jsonl``), for every reader.

The records and the line parser are :mod:`stormwatch.telemetry.events`
(the writer's own models); this module is the job-level view that chaos
(probes, reports, game days) and alerts (incident post-mortems) share:
:func:`read_job_logs` -> rank -> :class:`RankLog`, a few questions asked
of them, and the post-mortem engine's view of them (:func:`job_progress`: the
starts and steps as :class:`stormwatch.postmortem.progress.RankProgress`). The files are appended to while we read them: a torn last line or
a malformed line is skipped (and counted in :attr:`RankLog.skipped_lines`),
never fatal; a missing file or folder reads as empty. No torch import here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.postmortem.progress import Mark, RankProgress, StepDone, WorkerStart
from stormwatch.telemetry.events import (
    DoneEvent,
    RankEvent,
    StartEvent,
    StepEvent,
    parse_events,
)

logger = logging.getLogger(__name__)
_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")


@dataclass
class RankLog:
    """The events of one rank, in file order, and how many lines were unreadable."""

    rank: int
    events: list[RankEvent] = field(default_factory=list)
    skipped_lines: int = 0

    @property
    def starts(self) -> list[StartEvent]:
        """The ``start`` events (one per process incarnation), in file order."""
        return [e for e in self.events if isinstance(e, StartEvent)]

    @property
    def steps(self) -> list[StepEvent]:
        """The ``step`` events, in file order (a recomputed step appears once per attempt)."""
        return [e for e in self.events if isinstance(e, StepEvent)]

    @property
    def last_step(self) -> StepEvent | None:
        """The most recent ``step`` event (by file order: the latest attempt's)."""
        steps = self.steps
        return steps[-1] if steps else None

    @property
    def finished(self) -> bool:
        """The rank's latest process logged ``done``: a ``done`` event after its last
        ``start`` (file order; any ``done`` when it logged no start).

        Not by ``attempt``: TORCHELASTIC_RESTART_COUNT starts at 0 again under a new
        torchrun (a Slurm requeue, a resubmission), so the highest attempt can be an
        earlier process's (game day 04: attempts 0, 1, then 0 after the requeue, which
        finished).
        """
        starts = [i for i, e in enumerate(self.events) if isinstance(e, StartEvent)]
        latest = self.events[starts[-1] :] if starts else self.events
        return any(isinstance(e, DoneEvent) for e in latest)

    @property
    def done_at(self) -> float:
        """Unix time of the last ``done`` event (0.0 when the rank never finished)."""
        return max((e.time for e in self.events if isinstance(e, DoneEvent)), default=0.0)

    @property
    def latest_attempt(self) -> int:
        return max((e.attempt for e in self.events), default=0)

    def since_restart(self, when: float) -> list[RankEvent]:
        """Events of the first process incarnation started after Unix time ``when``, and later.

        A new incarnation begins with a ``start`` event. ``attempt`` cannot be used for
        this: TORCHELASTIC_RESTART_COUNT is per node, so a node whose workers were
        restarted because *another* node failed keeps its count (torchrun re-rendezvous
        without spending a restart).
        """
        for index, event in enumerate(self.events):
            if isinstance(event, StartEvent) and event.time > when:
                return self.events[index:]
        return []

    def attempt_at(self, when: float) -> int:
        """The attempt the rank was in at Unix time ``when`` (latest event at or before it)."""
        attempt = 0
        for event in self.events:
            if event.time <= when:
                attempt = max(attempt, event.attempt)
        return attempt


def read_rank_log(path: Path, rank: int) -> RankLog:
    """Parse one rank file; a missing file is an empty log."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return RankLog(rank=rank)
    events, skipped = parse_events(text)
    if skipped:
        # Counted in the result; a torn last line is normal while the rank appends.
        logger.debug("%s: skipped %d unreadable lines", path, skipped)
    return RankLog(rank=rank, events=events, skipped_lines=skipped)


def read_job_logs(log_dir: Path) -> dict[int, RankLog]:
    """Every ``rank<R>.jsonl`` in ``log_dir`` -> rank -> log (empty when the folder is missing)."""
    logs: dict[int, RankLog] = {}
    try:
        names = sorted(p.name for p in Path(log_dir).iterdir())
    except FileNotFoundError:
        return logs
    for name in names:
        match = _RANK_FILE.match(name)
        if match:
            rank = int(match.group(1))
            logs[rank] = read_rank_log(Path(log_dir) / name, rank)
    return logs


def current_world_size(logs: dict[int, RankLog], default: int) -> int:
    """Ranks of the job's latest rendezvous: the ``world_size`` of the most recent ``start``
    event of any rank (an elastic job that lost a node restarts smaller); ``default`` (the
    job's size) before any start, or for logs of trainers that do not write it."""
    starts = [e for log in logs.values() for e in log.starts]
    if not starts:
        return default
    latest = max(starts, key=lambda e: e.time)
    return latest.world_size if latest.world_size is not None else default


def last_completed_step(logs: dict[int, RankLog]) -> int:
    """Highest step any rank has completed (0 before the first step)."""
    return max((e.step or 0 for log in logs.values() for e in log.steps), default=0)


def final_losses(log: RankLog) -> dict[int, str]:
    """step -> ``loss_hex`` of the run's final trajectory (a recomputed step's last value wins)."""
    losses: dict[int, str] = {}
    for event in log.steps:
        if event.step is not None and event.loss_hex is not None:
            losses[event.step] = event.loss_hex
    return losses


def rank_progress(log: RankLog) -> RankProgress:
    """One rank's log as the post-mortem engine reads it: its starts and steps, in file order."""
    marks: list[Mark] = []
    for event in log.events:
        if isinstance(event, StartEvent):
            marks.append(
                WorkerStart(
                    time=event.time,
                    attempt=event.attempt,
                    resumed_from_step=event.resumed_from_step,
                    job_attempt=event.job_attempt,
                    restarted_by=tuple(event.restarted_by or ()),
                )
            )
        elif isinstance(event, StepEvent):
            marks.append(
                StepDone(
                    time=event.time,
                    step=event.step,
                    attempt=event.attempt,
                    loss=event.loss,
                    loss_hex=event.loss_hex,
                    step_seconds=event.step_seconds,
                )
            )
    return RankProgress(
        rank=log.rank, marks=tuple(marks), finished=log.finished, done_at=log.done_at
    )


def job_progress(logs: Mapping[int, RankLog]) -> dict[int, RankProgress]:
    """rank -> :func:`rank_progress`, in the order of ``logs``."""
    return {rank: rank_progress(log) for rank, log in logs.items()}


__all__ = [
    "RankLog",
    "current_world_size",
    "final_losses",
    "job_progress",
    "last_completed_step",
    "rank_progress",
    "read_job_logs",
    "read_rank_log",
]
