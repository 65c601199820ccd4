"""What a failure cost the job: steps lost, time and GPU-hours lost, goodput, and the loss check.

Inputs are the engine's progress model (:mod:`.progress`); times are Unix seconds,
durations seconds.

* :func:`measure_impact` (:class:`Impact`): world size, last step before the restart, step
  resumed from, steps lost, median step time, time lost, GPU-hours lost, goodput.
* :func:`compare_losses` (:class:`LossCheck`): the loss after recovery against a
  fault-free baseline's, bitwise (``float.hex``).
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stormwatch.postmortem.progress import (
    JobProgress,
    Restart,
    StepDone,
    last_step,
    steps_lost,
    steps_until,
)

#: Most recent step times the median step time is taken over.
MEDIAN_STEPS = 200


#: The job's attempt in a restart's sentence, as files before 2026-12-06 held it in
#: ``restart_count`` ("restart 2 of the job ...", earlier "job attempt 1 (...)").
_ATTEMPT_IN_WORDS = re.compile(r"\b(?:restart|attempt) ([0-9]{1,9})\b")


def older_restart_count(data: Any) -> Any:
    """A post-mortem's fields as read from a file written before ``restart_count`` became
    a number: its sentence moves to ``restart`` and the attempt it names (None: none) is
    the number, so ``plan --from-postmortems`` and ``chaos postmortem`` still read it."""
    if isinstance(data, dict) and isinstance(data.get("restart_count"), str):
        text = data["restart_count"]
        found = _ATTEMPT_IN_WORDS.search(text)
        number = int(found.group(1)) if found else None
        data = {**data, "restart_count": number, "restart": data.get("restart") or text}
    return data


class Impact(BaseModel):
    """What the incident cost the job.

    Attributes:
        world_size: ranks of the job (rank logs, else Prometheus).
        last_step_before: last step completed before the workers restarted.
        resumed_from_step: checkpoint step the restarted workers resumed from.
        steps_lost: ``last_step_before - resumed_from_step`` (computed again).
        median_step_seconds: median step time before the onset (rank logs).
        median_step_interval_seconds: median wall time between a rank's consecutive steps
            before the onset: the job's cadence, with what a step's own time leaves out
            (data loading, a delay, logging); what the job takes per step when healthy.
        time_lost_seconds: onset -> the job completes ``last_step_before`` again
            (when it did); else onset -> first step after resume plus
            ``steps_lost x`` the median step interval (else the median step time).
        gpu_hours_lost: ``world_size x time_lost_seconds / 3600`` (every rank
            holds a GPU for the whole outage; ETTR accounting as in Meta's
            "Revisiting reliability in large-scale ML research clusters", 2024).
        goodput: share of the incident's wall time (onset -> incident closed)
            spent on new steps: ``new steps x median step interval / duration``, 0..1 (the
            median step time when no interval is known); a healthy job reads about 1
            (fresh-user finding: by the step time alone, the demo's job with a 0.3 s step
            delay read 27 % healthy and 13 % during the incident).
        restart_count: the restart's job attempt, a number: how many times the job had
            restarted, as its ranks agreed (None: not known, an older trainer's log).
        restart: the same in words, with the node-local counts and the nodes that failed
            with the rank that failed on each
            (:meth:`~stormwatch.postmortem.progress.Restart.counts`).
    """

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _older_files(cls, data: Any) -> Any:
        return older_restart_count(data)

    world_size: int | None = None
    last_step_before: int | None = None
    resumed_from_step: int | None = None
    steps_lost: int | None = None
    median_step_seconds: float | None = None
    median_step_interval_seconds: float | None = None
    time_lost_seconds: float | None = None
    gpu_hours_lost: float | None = None
    goodput: float | None = None
    restart_count: int | None = None
    restart: str | None = None


def measure_impact(
    progress: JobProgress,
    restart: Restart,
    *,
    onset: float | None,
    resolved_at: float | None,
    failed_ranks: Mapping[str, int] | None = None,
) -> Impact:
    """The :class:`Impact` of a failure at ``onset`` that the job answered with ``restart``
    (``resolved_at``: when the incident closed, for goodput; ``failed_ranks``: node -> the
    rank whose failure there caused the restart, shown in ``restart``). Steps before
    the restart (or the onset, without one) count as done before the failure."""
    impact = Impact(
        world_size=len(progress) or None,
        resumed_from_step=restart.resumed_from_step,
        restart_count=restart.job_attempt,
        restart=restart.counts(failed_ranks),
    )
    if onset is None or not progress:
        return impact
    cut = restart.started_at if restart.started_at is not None else onset
    before = steps_until(progress, cut)
    durations = [s.step_seconds for s in before if s.time <= onset and s.step_seconds]
    if durations:
        impact.median_step_seconds = statistics.median(durations[-MEDIAN_STEPS:])
    intervals = _step_intervals(progress, onset)
    if intervals:
        impact.median_step_interval_seconds = statistics.median(intervals[-MEDIAN_STEPS:])
    impact.last_step_before = last_step(before)
    impact.steps_lost = steps_lost(impact.last_step_before, impact.resumed_from_step)
    top = impact.last_step_before
    median = impact.median_step_interval_seconds or impact.median_step_seconds
    regained = [s.time for s in restart.steps if top is not None and (s.step or 0) >= top]
    recovered = restart.first_step
    if regained:
        impact.time_lost_seconds = min(regained) - onset
    elif recovered is not None and median is not None:
        impact.time_lost_seconds = (recovered.time - onset) + (impact.steps_lost or 0) * median
    if impact.time_lost_seconds is not None and impact.world_size:
        impact.gpu_hours_lost = impact.world_size * impact.time_lost_seconds / 3600.0
    if resolved_at is not None and resolved_at > onset and median is not None:
        new = {s.step for s in restart.steps if (s.step or 0) > (top or 0)}
        impact.goodput = min(1.0, len(new) * median / (resolved_at - onset))
    return impact


def _step_intervals(progress: JobProgress, onset: float) -> list[float]:
    """Seconds between each rank's consecutive steps (``n`` then ``n + 1`` in one attempt)
    completed at or before ``onset``, rank by rank in time order."""
    out: list[float] = []
    for rank in progress.values():
        steps = [s for s in rank.steps if s.time <= onset and s.step is not None]
        for a, b in itertools.pairwise(steps):
            if b.attempt == a.attempt and b.step == (a.step or 0) + 1 and b.time > a.time:
                out.append(b.time - a.time)
    return out


class LossMismatch(BaseModel):
    """A step whose loss differs from the baseline's (``*_hex`` is ``float.hex``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int
    baseline_hex: str
    experiment_hex: str


class LossCheck(BaseModel):
    """Loss after recovery vs. the baseline; ``identical`` None when nothing could be compared
    (``note`` says why)."""

    model_config = ConfigDict(extra="forbid")

    baseline: str | None = None
    from_step: int | None = None
    compared_steps: int = 0
    identical: bool | None = None
    mismatches: list[LossMismatch] = Field(default_factory=list)
    missing_in_baseline: list[int] = Field(default_factory=list)
    note: str = ""


def compare_losses(
    steps: Iterable[StepDone],
    expected: Mapping[int, str],
    *,
    from_step: int,
    baseline: str | None,
) -> LossCheck:
    """Compare the ``loss_hex`` of every step from ``from_step`` on (the last logged value of a
    step wins) with the baseline's ``expected`` step -> ``loss_hex``."""
    check = LossCheck(baseline=baseline, from_step=from_step)
    actual: dict[int, str] = {}
    for s in steps:
        if s.step is not None and s.loss_hex is not None and s.step >= from_step:
            actual[s.step] = s.loss_hex
    for step in sorted(actual):
        if step not in expected:
            check.missing_in_baseline.append(step)
        elif expected[step] != actual[step]:
            check.mismatches.append(
                LossMismatch(step=step, baseline_hex=expected[step], experiment_hex=actual[step])
            )
    check.compared_steps = len(actual) - len(check.missing_in_baseline)
    if check.compared_steps == 0:
        check.note = "no step after recovery has a loss in both runs"
        return check
    check.identical = not check.mismatches
    return check


__all__ = [
    "MEDIAN_STEPS",
    "Impact",
    "LossCheck",
    "LossMismatch",
    "compare_losses",
    "measure_impact",
]
