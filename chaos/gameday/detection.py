"""One experiment's detection judged against issue 18's targets, for its scorecard row.

Brings together what the suite has after an experiment (the journal, the post-mortem,
the evidence's alerts and rank placements, the job's rank logs) and the rules of
:mod:`.targets` (detection class, its target, within it) and :mod:`.culprits` (culprit
correct, false alarms). :func:`judge_detection` returns the row's fields and, in words,
what fails a row whose targets are enforced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from stormwatch.chaos.experiment.model import ActionActivity, Experiment
from stormwatch.chaos.gameday.culprits import (
    FaultPlace,
    culprit,
    false_alarms,
    fault_place,
    judge_culprit,
)
from stormwatch.chaos.gameday.scorecard import FiredAlert
from stormwatch.chaos.gameday.targets import TARGETS, job_pace, target_seconds, within_target
from stormwatch.chaos.reports.evidence import AlertEvidence, RankPlacement
from stormwatch.contracts.journal import Journal
from stormwatch.faults import detect_class_of
from stormwatch.postmortem import ExperimentPostMortem
from stormwatch.telemetry.ranklogs import RankLog

#: How many false alarms a failure reason lists by name (the rest are counted).
LISTED_ALARMS = 5


@dataclasses.dataclass(frozen=True, kw_only=True)
class Detection:
    """The row's detecting alert (the scorecard's choice: an expected alert, else the
    post-mortem's; :func:`stormwatch.chaos.gameday.suite.detecting_alert`).

    Attributes:
        detected: an alert detected the fault.
        alert / labels / firing_at: that alert (None / empty when not detected).
        time_to_detect: fault -> its first firing sample, seconds.
    """

    detected: bool
    alert: str | None = None
    time_to_detect: float | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    firing_at: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DetectionVerdict:
    """A row's detection-target fields (see :class:`~.scorecard.ScorecardRow`) and the
    reasons they give to fail it (``problems``, one sentence each)."""

    detect_class: str | None = None
    target_seconds: float | None = None
    within_target: bool | None = None
    culprit: dict[str, str] = dataclasses.field(default_factory=dict)
    culprit_correct: bool | None = None
    false_alarms: list[FiredAlert] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    def row_fields(self) -> dict[str, Any]:
        """The :class:`~.scorecard.ScorecardRow` fields, by name."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "problems"
        }


def fault_spec(experiment: Experiment, journal: Journal, pm: ExperimentPostMortem) -> object:
    """The post-mortem's fault as the experiment gave it: its ledger row's spec (targets
    resolved), else the file's first action of that kind; None when neither has it."""
    for entry in journal.faults:
        if entry.id == pm.fault_id:
            return entry.spec
    for activity in experiment.method:
        if isinstance(activity, ActionActivity) and activity.fault.kind == pm.fault_kind:
            return activity.fault
    return None


def judge_detection(
    experiment: Experiment,
    journal: Journal,
    pm: ExperimentPostMortem,
    detection: Detection,
    *,
    alerts: Sequence[AlertEvidence],
    logs: Mapping[int, RankLog],
    placements: Sequence[RankPlacement] = (),
) -> DetectionVerdict:
    """Judge one experiment's ``detection``: its class and target, whether it was within
    it, its culprit, and the false alarms. ``alerts``: every alert of the evidence;
    ``logs``: the job's rank logs; ``placements``: which node ran which rank."""
    spec = fault_spec(experiment, journal, pm)
    detect_class = detect_class_of(pm.fault_kind, spec)
    class_name = detect_class.value if detect_class is not None else None
    target = TARGETS.get(detect_class) if detect_class is not None else None
    pace = job_pace(logs, pm.fault_at, experiment.job.checkpoint_every)
    seconds = target_seconds(target, pace, pm.fault_at) if target is not None else None
    injected = pm.fault_at is not None
    within = within_target(
        seconds,
        detection.time_to_detect,
        detected=detection.detected if injected else None,
        expected=experiment.expect.detect,
    )
    place = fault_place(
        kind=pm.fault_kind,
        spec=spec,
        job=pm.job or (journal.job.name if journal.job is not None else None),
        rank=pm.fault_rank,
        node=pm.fault_node,
        placements=placements,
    )
    start, end = journal.started_at, journal.ended_at
    during = [a for a in alerts if a.firing_at >= start and (end is None or a.firing_at <= end)]
    alarms = [
        _fired(a)
        for a in false_alarms(
            during,
            place=place,
            expected=experiment.expect.alerts,
            fault_at=pm.fault_at,
            started_at=start,
            ended_at=end,
        )
    ]
    named = detection.alert if detection.detected and injected else None
    labels = _judged_labels(detection, named, place, during)
    correct, why = judge_culprit(named, labels, place=place, target=target, alerts=during)
    problems = []
    if within is False and detection.time_to_detect is not None and seconds is not None:
        problems.append(
            f"detected in {detection.time_to_detect:.1f} s, over the {class_name} target "
            f"({seconds:.1f} s)"
        )
    if correct is False:
        problems.append(f"culprit: {why}")
    if alarms:
        problems.append(_alarms_text(alarms))
    return DetectionVerdict(
        detect_class=class_name,
        target_seconds=seconds,
        within_target=within,
        culprit=culprit(labels) if named else {},
        culprit_correct=correct,
        false_alarms=alarms,
        problems=problems,
    )


def _judged_labels(
    detection: Detection,
    named: str | None,
    place: FaultPlace,
    during: Sequence[AlertEvidence],
) -> Mapping[str, str]:
    """The detecting alert's labels; or, when one rule evaluation fired it for several ranks
    or nodes at once (same name, same moment), those of the one naming the fault (a tie is
    not a wrong culprit)."""
    if named is None or detection.firing_at is None or place.names(detection.labels):
        return detection.labels
    tied = [
        a
        for a in during
        if a.alertname == named and a.firing_at == detection.firing_at and place.names(a.labels)
    ]
    return tied[0].labels if tied else detection.labels


def _alarms_text(alarms: Sequence[FiredAlert]) -> str:
    listed = ", ".join(str(a) for a in alarms[:LISTED_ALARMS])
    more = f" and {len(alarms) - LISTED_ALARMS} more" if len(alarms) > LISTED_ALARMS else ""
    return f"{len(alarms)} false alarm(s): {listed}{more}"


def _fired(alert: AlertEvidence) -> FiredAlert:
    labels = {k: v for k, v in alert.labels.items() if k != "alertname"}
    return FiredAlert(alertname=alert.alertname, labels=labels, firing_at=alert.firing_at)


__all__ = ["LISTED_ALARMS", "Detection", "DetectionVerdict", "fault_spec", "judge_detection"]
