"""Detect-time targets of the game day: one per detection class (issue 18, item 3).

Each fault kind declares how an alert is expected to notice it, its detection class
(:attr:`stormwatch.faults.Traits.detect_class`, :func:`stormwatch.faults.detect_class_of`;
``trainer_fault`` by its ``point``). The class is a trait of the fault, declared once
with the kind's other traits (its ``category`` is the same kind of fact); the target is
not: it is what the game day asks of the alert rules on the lab (scrape and rule
evaluation every 1 s), it changes with the rules, and it lives here, in
:data:`TARGETS`, next to the scorecard that holds each row against it.

Targets (fault -> first firing sample of the detecting alert, seconds):

===================================================  ========================================
class                                                target
===================================================  ========================================
rank_killed, node_lost, gpu_xid, gpu_lost            2 s
hung_rank, hung_collective, partition,               max(3 x the job's median step time,
store_isolation                                      5 s) + 2 s
nvlink_down, agent_down                              5 s
node_down (the node's agent cannot report)           10 s
slow_rank, cpu_throttle                              20 s; the alert names the slowed rank
                                                     and no alert of its name a waiting rank
bandwidth_starved, packet_loss                       30 s; the alert names the node
checkpoint_failing                                   before the job's next save after the
                                                     first failed one
gpu_throttle, nvlink_errors                          none (issue 18 sets none)
===================================================  ========================================

The job's median step time is the median time between a rank's consecutive steps before
the fault, from the rank logs the post-mortem reads (:func:`job_pace`): what the agent's
hang threshold takes as the job's step time (heartbeat delta per step, so time spent
between steps, like a data loader's wait or a ``step_delay``, counts). Without two
consecutive steps, the median ``step_seconds`` (what the trainer observes into
``stormwatch_train_step_duration_seconds``).

"Before the job's next save after the first failed one", exactly: the first
``checkpoint_failed`` record any rank logged at or after the fault names the step ``s``
whose save failed; the job's next save starts when step ``s + checkpoint_every`` is
completed (the trainer saves right after the step), so the target is that moment
minus the fault's. When the job did not get that far (it finished, or stopped), the
moment is estimated as the failure's time plus ``checkpoint_every`` x the median time
between two steps before the fault. No failed save after the fault: no target (there
was nothing to alert on in time).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from stormwatch.faults import DetectClass
from stormwatch.telemetry.events import CheckpointFailedEvent, StepEvent
from stormwatch.telemetry.ranklogs import RankLog

#: Hung classes: the target is max(HUNG_STEP_FACTOR x median step s, HUNG_FLOOR_SECONDS)
#: + HUNG_SLACK_SECONDS (issue 18: "≤ max(3 x the job's median step time, 5 s) + 2 s").
HUNG_STEP_FACTOR = 3.0
HUNG_FLOOR_SECONDS = 5.0
HUNG_SLACK_SECONDS = 2.0

#: How a class's target is set: a fixed number of seconds; the hung formula; the job's
#: next save after the first failed one; none.
TargetRule = Literal["seconds", "hung", "next_save", "none"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DetectTarget:
    """The target of one detection class.

    Attributes:
        rule: how the target is set (:data:`TargetRule`).
        seconds: the target of a ``seconds`` rule.
        names: the label the detecting alert must name for its culprit to be correct
            (``rank``: the slowed rank; ``node``: the node; a rank the job ran on that
            node names it too); None: the culprit is judged only when the alert names one.
        no_waiting_rank: the culprit is also wrong when any alert of the detecting
            alert's name names another rank of the job during the experiment (a
            straggler rule must not name the ranks that wait for the slow one).
        text: the target in words, as the scorecard and the docs show it.
    """

    rule: TargetRule
    seconds: float | None = None
    names: Literal["rank", "node"] | None = None
    no_waiting_rank: bool = False
    text: str


def _fixed(
    seconds: float,
    text: str = "",
    *,
    names: Literal["rank", "node"] | None = None,
    no_waiting_rank: bool = False,
) -> DetectTarget:
    return DetectTarget(
        rule="seconds",
        seconds=seconds,
        names=names,
        no_waiting_rank=no_waiting_rank,
        text=text or f"≤ {seconds:g} s",
    )


_HUNG = DetectTarget(rule="hung", text="≤ max(3 x median step s, 5 s) + 2 s")
_SLOW = _fixed(20.0, "≤ 20 s, the slowed rank named", names="rank", no_waiting_rank=True)
_LINK = _fixed(30.0, "≤ 30 s, the node named", names="node")
_NONE = DetectTarget(rule="none", text="none")

#: Detection class -> its target (issue 18, item 3; the module docstring has the table).
TARGETS: Mapping[DetectClass, DetectTarget] = MappingProxyType(
    {
        DetectClass.RANK_KILLED: _fixed(2.0),
        DetectClass.NODE_LOST: _fixed(2.0),
        DetectClass.GPU_XID: _fixed(2.0),
        DetectClass.GPU_LOST: _fixed(2.0),
        DetectClass.HUNG_RANK: _HUNG,
        DetectClass.HUNG_COLLECTIVE: _HUNG,
        DetectClass.PARTITION: _HUNG,
        DetectClass.STORE_ISOLATION: _HUNG,
        DetectClass.NVLINK_DOWN: _fixed(5.0),
        DetectClass.AGENT_DOWN: _fixed(5.0),
        # "≤ 10 s for a node whose agent cannot report": the node is unreachable as a whole
        DetectClass.NODE_DOWN: _fixed(10.0),
        DetectClass.SLOW_RANK: _SLOW,
        DetectClass.CPU_THROTTLE: _SLOW,
        DetectClass.BANDWIDTH_STARVED: _LINK,
        DetectClass.PACKET_LOSS: _LINK,
        DetectClass.CHECKPOINT_FAILING: DetectTarget(
            rule="next_save", text="before the next save after the first failed one"
        ),
        DetectClass.GPU_THROTTLE: _NONE,
        DetectClass.NVLINK_ERRORS: _NONE,
    }
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobPace:
    """How fast the job went before the fault, and its first failed save after it.

    Attributes:
        median_step_seconds: median ``step_seconds`` of the steps completed before the
            fault, every rank (None: no step before the fault logged one).
        median_step_interval_seconds: median time between a rank's consecutive steps
            before the fault (compute, collectives and the job's ``step_delay``).
        first_failed_save_at / first_failed_save_step: the earliest ``checkpoint_failed``
            record at or after the fault (Unix s), and the step whose save failed.
        next_save_at: when the job's next save after it started (Unix s; see the module
            docstring), None when unknown.
    """

    median_step_seconds: float | None = None
    median_step_interval_seconds: float | None = None
    first_failed_save_at: float | None = None
    first_failed_save_step: int | None = None
    next_save_at: float | None = None


def job_pace(
    logs: Mapping[int, RankLog], fault_at: float | None, checkpoint_every: int | None
) -> JobPace:
    """The job's :class:`JobPace` from its rank logs (``checkpoint_every``: steps between
    two saves, the experiment's ``job.checkpoint_every``)."""
    if fault_at is None:
        return JobPace()
    seconds: list[float] = []
    intervals: list[float] = []
    for log in logs.values():
        previous: StepEvent | None = None
        for event in log.steps:
            if event.time > fault_at:
                break
            if event.step_seconds is not None and event.step_seconds > 0:
                seconds.append(event.step_seconds)
            if (
                previous is not None
                and event.step is not None
                and previous.step is not None
                and event.step == previous.step + 1
                and event.attempt == previous.attempt
            ):
                intervals.append(event.time - previous.time)
            previous = event
    interval = statistics.median(intervals) if intervals else None
    failed = [
        e
        for log in logs.values()
        for e in log.events
        if isinstance(e, CheckpointFailedEvent) and e.time >= fault_at
    ]
    first = min(failed, key=lambda e: e.time) if failed else None
    return JobPace(
        median_step_seconds=statistics.median(seconds) if seconds else None,
        median_step_interval_seconds=interval,
        first_failed_save_at=first.time if first is not None else None,
        first_failed_save_step=first.step if first is not None else None,
        next_save_at=_next_save(logs, first, checkpoint_every, interval),
    )


def _next_save(
    logs: Mapping[int, RankLog],
    failed: CheckpointFailedEvent | None,
    checkpoint_every: int | None,
    interval: float | None,
) -> float | None:
    """When the save after ``failed`` started: step ``failed.step + checkpoint_every``
    completed (first rank), else estimated from the median step interval."""
    if failed is None or checkpoint_every is None:
        return None
    if failed.step is not None:
        due = failed.step + checkpoint_every
        done = [
            e.time
            for log in logs.values()
            for e in log.steps
            if e.step == due and e.time > failed.time
        ]
        if done:
            return min(done)
    return failed.time + checkpoint_every * interval if interval is not None else None


def target_seconds(target: DetectTarget, pace: JobPace, fault_at: float | None) -> float | None:
    """The class's target for this run, seconds after the fault (None: no target, or what
    it needs is unknown: no step time for a hung class, no failed save for a checkpoint)."""
    if target.rule == "seconds":
        return target.seconds
    if target.rule == "hung":
        median = pace.median_step_interval_seconds or pace.median_step_seconds
        if median is None:
            return None
        step = HUNG_STEP_FACTOR * median
        return max(step, HUNG_FLOOR_SECONDS) + HUNG_SLACK_SECONDS
    if target.rule == "next_save":
        if pace.next_save_at is None or fault_at is None:
            return None
        return max(0.0, pace.next_save_at - fault_at)
    return None


def within_target(
    target: float | None, time_to_detect: float | None, *, detected: bool | None, expected: bool
) -> bool | None:
    """Detected no later than ``target`` seconds after the fault.

    None: no target, or nothing to judge (no fault injected; not detected where the
    experiment expects no detection). Not detected where it expects one: False.
    """
    if target is None or detected is None:
        return None
    if not detected or time_to_detect is None:
        return False if expected else None
    return time_to_detect <= target


__all__ = [
    "HUNG_FLOOR_SECONDS",
    "HUNG_SLACK_SECONDS",
    "HUNG_STEP_FACTOR",
    "TARGETS",
    "DetectTarget",
    "JobPace",
    "TargetRule",
    "job_pace",
    "target_seconds",
    "within_target",
]
