"""Detection targets per fault class (issue 18): the one table the scorecard, the soak
and docs/detection.md use.

Each class names the fault kinds (and, for ``trainer_fault``, the fault points) it covers,
its time-to-detect target (fault -> the first alert firing, on the lab with scrape and rule
evaluation every second) and what the alert must name (``culprit``: the ``rank`` or
``node`` label of the faulted rank or node; ``None``: the job, nothing to check).

The hang class's target depends on the job: ``max(3 x median step, 5 s) + 2 s`` (the
agent's warm stall threshold, :class:`stormwatch.agent.watch.detectors.HangSettings`, plus
one scrape and one evaluation). Without a measured median the 5 s floor applies (the
game-day jobs step in well under 2 s).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Culprit = Literal["rank", "node"]


@dataclass(frozen=True, kw_only=True)
class DetectTarget:
    """One fault class's target.

    Attributes:
        name: the class, as the issue's table names it.
        kinds: fault kinds of the class; ``trainer_fault`` entries are
            ``trainer_fault:<point>``.
        seconds: the target (s); for step-scaled classes the floor.
        step_factor: when set, the target is ``max(step_factor x median step, seconds)
            + slack_seconds``.
        slack_seconds: scrape + evaluation added to a step-scaled target.
        culprit: the label that must name the faulted rank or node (None: the job).
    """

    name: str
    kinds: tuple[str, ...]
    seconds: float | None
    step_factor: float | None = None
    slack_seconds: float = 0.0
    culprit: Culprit | None = None

    def target_seconds(self, median_step_seconds: float | None = None) -> float | None:
        """The class's target in seconds for a job with this median step (None: none)."""
        if self.seconds is None:
            return None
        if self.step_factor is None:
            return self.seconds
        scaled = self.step_factor * (median_step_seconds or 0.0)
        return max(scaled, self.seconds) + self.slack_seconds


#: Issue 18's table. "at the first failed save": the checkpoint rule has no wait; the
#: scorecard holds it to 2 s after the fault (a save fails at the fault or later).
TARGETS: tuple[DetectTarget, ...] = (
    DetectTarget(
        name="rank killed",
        kinds=("kill_rank", "kill_torchrun"),
        seconds=2.0,
        culprit="rank",
    ),
    DetectTarget(
        name="node lost",
        kinds=("kill_node_processes", "kill_rdzv_host"),
        seconds=2.0,
        culprit="node",
    ),
    DetectTarget(name="GPU XID / ECC / lost", kinds=("gpu_xid", "gpu_lost"), seconds=2.0),
    DetectTarget(
        name="hung rank",
        kinds=("freeze_rank", "freeze_ranks", "trainer_fault:collective_hang"),
        seconds=5.0,
        step_factor=3.0,
        slack_seconds=2.0,
        culprit="rank",
    ),
    DetectTarget(
        name="partition / store isolation",
        kinds=("partition", "isolate_store", "link_flap"),
        seconds=5.0,
        step_factor=3.0,
        slack_seconds=2.0,
    ),
    DetectTarget(name="NVLink down", kinds=("nvlink_down",), seconds=5.0, culprit="node"),
    DetectTarget(name="node agent down", kinds=("kill_agent",), seconds=5.0, culprit="node"),
    DetectTarget(
        name="slow rank / CPU throttle",
        kinds=("trainer_fault:slow_step", "cpu_throttle"),
        seconds=20.0,
        culprit="rank",
    ),
    DetectTarget(
        name="bandwidth-starved link / packet loss",
        kinds=("bandwidth_limit", "packet_drop"),
        seconds=30.0,
        culprit="node",
    ),
    DetectTarget(
        name="checkpoint failing",
        kinds=("checkpoint_full", "checkpoint_readonly"),
        seconds=2.0,
    ),
)


def target_for(kind: str | None, point: str | None = None) -> DetectTarget | None:
    """The class of fault ``kind`` (``point`` for ``trainer_fault``), or None."""
    if kind is None:
        return None
    key = f"{kind}:{point}" if kind == "trainer_fault" else kind
    for target in TARGETS:
        if key in target.kinds:
            return target
    return None


def culprit_named(
    target: DetectTarget | None,
    labels: Iterable[dict[str, str]],
    *,
    fault_rank: int | None,
    fault_node: str | None,
) -> bool | None:
    """Whether the alerts (their label sets) name the faulted rank or node and nothing else.

    None when there is nothing to check: no class, a class without a culprit, or no
    faulted rank/node known. False when no alert names that label at all (the culprit
    was not named) or one names another rank/node (a victim was blamed).
    """
    if target is None or target.culprit is None:
        return None
    want = str(fault_rank) if target.culprit == "rank" else fault_node
    if want is None:
        return None
    named = {ls[target.culprit] for ls in labels if target.culprit in ls}
    if not named:
        return False
    return named == {want}


__all__ = ["TARGETS", "Culprit", "DetectTarget", "culprit_named", "target_for"]
