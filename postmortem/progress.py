"""A training job's progress as the post-mortem engine reads it: who stepped when, and restarts.

The engine's own view of the rank logs (the trainer writes them; its reader,
:mod:`stormwatch.telemetry.ranklogs`, turns a job's logs into this with
``job_progress``): per rank, the worker starts and completed steps in file order
(:class:`RankProgress`), and the questions both post-mortems ask of them
(:func:`restart_after`, :func:`steps_until`, :func:`last_step`). Times are Unix seconds.

A restart is read from ``start`` marks, never from ``attempt``: torchrun counts restarts
per node, so a node whose workers restarted because *another* node failed keeps its
count (torchrun re-rendezvous without spending a restart). The job-wide count is the
start's ``job_attempt`` (every rank agreed it, :mod:`stormwatch.telemetry.restarts`),
shown beside the node counts by :meth:`Restart.counts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerStart:
    """A worker process of the rank started (``resumed_from_step`` None: a fresh start)."""

    time: float
    attempt: int = 0
    resumed_from_step: int | None = None
    job_attempt: int | None = None
    restarted_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepDone:
    """The rank completed ``step`` (``loss_hex``: ``float.hex`` of the global mean loss;
    ``step_seconds``: the step's wall time)."""

    time: float
    step: int | None
    attempt: int = 0
    loss: float | None = None
    loss_hex: str | None = None
    step_seconds: float | None = None


Mark = WorkerStart | StepDone


@dataclass(frozen=True)
class RankProgress:
    """One rank's starts and steps, in file order (a recomputed step appears once per attempt).

    Attributes:
        rank: the global rank.
        marks: starts and steps as logged.
        finished: the rank logged ``done`` in its latest attempt.
        done_at: Unix time of its last ``done`` (0.0 when it never finished).
    """

    rank: int
    marks: tuple[Mark, ...] = ()
    finished: bool = False
    done_at: float = 0.0

    @property
    def steps(self) -> list[StepDone]:
        """The completed steps, in file order."""
        return [m for m in self.marks if isinstance(m, StepDone)]

    def since_restart(self, when: float) -> list[Mark]:
        """The marks of the first worker started after Unix time ``when``, and every later one."""
        for index, mark in enumerate(self.marks):
            if isinstance(mark, WorkerStart) and mark.time > when:
                return list(self.marks[index:])
        return []

    def last_step_before(self, when: float) -> StepDone | None:
        """The last step (in file order) completed at or before Unix time ``when``."""
        steps = [s for s in self.steps if s.time <= when]
        return steps[-1] if steps else None

    def final_losses(self) -> dict[int, str]:
        """step -> ``loss_hex`` of the run's final trajectory (a recomputed step's last value wins)."""
        return {
            s.step: s.loss_hex for s in self.steps if s.step is not None and s.loss_hex is not None
        }

    def loss_segments(self) -> list[list[tuple[int, float]]]:
        """(step, loss) per worker incarnation, in file order (a start begins a new one)."""
        segments: list[list[tuple[int, float]]] = [[]]
        for mark in self.marks:
            if isinstance(mark, WorkerStart) and segments[-1]:
                segments.append([])
            elif isinstance(mark, StepDone) and mark.step is not None and mark.loss is not None:
                segments[-1].append((mark.step, mark.loss))
        return [s for s in segments if s]


#: rank -> progress, in the order the ranks' logs were read.
JobProgress = Mapping[int, RankProgress]


@dataclass(frozen=True)
class Restart:
    """What the job did after a moment: every mark of the worker incarnations started after
    it, all ranks, by time (empty when no worker started again).

    Attributes:
        marks: the marks, ordered by time (ties keep rank order).
        starts / steps: the starts and the completed steps among them.
    """

    marks: tuple[Mark, ...] = ()
    starts: tuple[WorkerStart, ...] = field(init=False)
    steps: tuple[StepDone, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "starts", tuple(m for m in self.marks if isinstance(m, WorkerStart))
        )
        object.__setattr__(self, "steps", tuple(m for m in self.marks if isinstance(m, StepDone)))

    def counts(self, ranks: Mapping[str, int] | None = None) -> str | None:
        """Both restart counts of the restart and what caused it, as shown: ``restart 2 of the
        job (its nodes' torchrun counts: 1, 1); restarted by a failure on nodeB (rank 3)``
        (the job's attempt, which every rank agreed, and each node's
        ``TORCHELASTIC_RESTART_COUNT``, which a node restarted for its peer keeps); ``None``
        without a start. ``ranks``: node -> the rank that failed on it, in the order they
        failed (:func:`stormwatch.postmortem.causes.failed_ranks`); the first is the
        cause and the others follow it, ``nodeA (rank 1), followed by nodeB (rank 3)``, so
        that a rank that failed because the first one did (its collectives broke) does not
        read as a second cause. The start's other nodes (no exit seen there; an older
        trainer named none) follow as well."""
        if not self.starts:
            return None
        first = self.starts[0]
        nodes = ", ".join(str(c) for c in sorted({s.attempt for s in self.starts}))
        which = "a restart" if first.job_attempt is None else f"restart {first.job_attempt}"
        text = f"{which} of the job (its nodes' torchrun counts: {nodes})"
        ranks = ranks or {}
        failed = [f"{node} (rank {rank})" for node, rank in ranks.items()]
        failed += [node for node in first.restarted_by if node not in ranks]
        if ranks and len(failed) > 1:
            text += f"; restarted by a failure on {failed[0]}, followed by " + ", ".join(failed[1:])
        elif failed:  # no exit seen: the nodes the start names, in its order
            text += "; restarted by a failure on " + ", ".join(failed)
        return text

    @property
    def job_attempt(self) -> int | None:
        """The restart's job attempt (the job's restarts so far, as every rank agreed); None
        without a start or from an older trainer's log."""
        return self.starts[0].job_attempt if self.starts else None

    @property
    def started_at(self) -> float | None:
        """When the first worker started again."""
        return self.starts[0].time if self.starts else None

    @property
    def resumed_from_step(self) -> int | None:
        """The checkpoint step the first restarted worker resumed from (0: from scratch)."""
        return (self.starts[0].resumed_from_step or 0) if self.starts else None

    @property
    def first_step(self) -> StepDone | None:
        """The first step a restarted worker completed: the recovery."""
        return self.steps[0] if self.steps else None


def restart_after(progress: JobProgress, when: float | None) -> Restart:
    """The job's restart after Unix time ``when`` (an empty one for ``when`` None)."""
    if when is None:
        return Restart()
    marks = [m for rank in progress.values() for m in rank.since_restart(when)]
    return Restart(tuple(sorted(marks, key=lambda m: m.time)))


def steps_until(progress: JobProgress, when: float) -> list[StepDone]:
    """Every step completed at or before Unix time ``when``, rank by rank in file order."""
    return [s for rank in progress.values() for s in rank.steps if s.time <= when]


def last_step(steps: list[StepDone]) -> int | None:
    """The highest step number among ``steps`` (None when none has one)."""
    return max((s.step for s in steps if s.step is not None), default=None)


def steps_lost(last_before: int | None, resumed_from: int | None) -> int | None:
    """Steps computed again: the last step before the failure minus the step resumed from."""
    if last_before is None or resumed_from is None:
        return None
    return max(0, last_before - resumed_from)


def elapsed(start: float | None, end: float | None) -> float | None:
    """Seconds from ``start`` to ``end`` (never negative: the clocks of the agent, Prometheus
    and the responder stamp one host's time at slightly different moments); None when either
    moment was not observed. Time to detect is onset -> alert firing, time to recover is
    onset -> recovery."""
    if start is None or end is None:
        return None
    return max(0.0, end - start)


__all__ = [
    "JobProgress",
    "Mark",
    "RankProgress",
    "Restart",
    "StepDone",
    "WorkerStart",
    "elapsed",
    "last_step",
    "restart_after",
    "steps_lost",
    "steps_until",
]
