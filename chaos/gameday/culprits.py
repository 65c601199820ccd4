"""Who an alert names, whether that is where the fault was, and which alerts were false alarms.

The game-day scorecard's culprit and false-alarm columns (docs/chaos-suite.md, "The
scorecard"). An alert names a place by its labels ``rank``, ``node``, ``gpu`` and
``link`` (:data:`CULPRIT_LABELS`; ``training_job`` says whose). A fault's place
(:class:`FaultPlace`) is what its experiment fault named, where it landed, and, for a
node fault, every rank the job ran on that node (the evidence's
:class:`~stormwatch.chaos.reports.evidence.RankPlacement`).

Definitions:

* **names the fault**: every one of the alert's culprit labels points at the fault's
  place, and it names no other training job. ``rank``: a rank fault's rank; for a node
  fault, the rank it was given by or any rank the job ran on a faulted node. ``node``:
  the faulted node (for a rank fault, the node holding the rank). ``gpu``: the faulted
  GPU (GPU faults). ``link``: one of the faulted links (NVLink faults; all when the
  fault names none). A partition names both sides: with no ``peers``, every node.
* **culprit correct** (of the detecting alert): it names the fault (above); an alert
  that names no place is not judged (None) unless the class needs one named
  (:attr:`~stormwatch.chaos.gameday.targets.DetectTarget.names`: a slow rank's rank,
  a degraded link's node; then False); for the slow classes also no alert of the
  detecting alert's name names another rank of the job during the experiment. When
  one rule evaluation fired the detecting alert for several places at once, the one
  naming the fault is judged (:mod:`.detection`).
* **false alarm**: an alert that started firing between the experiment's start and
  end (the journal's) and is neither expected nor caused by the fault: it names
  another training job (always a false alarm, expected name or not); or it fired before
  the fault (expected name or not: the steady state already alarmed); or its name is
  not in ``expect.alerts`` and it names a place that is not the fault's. (When the
  fault's time is unknown, an expected name is not judged.) An alert about the job as a whole (no place named: the
  job hung, its throughput dropped, its saves fail) that fired after the fault is
  caused by the fault: a rank kill legitimately fires ``StormwatchTrainingHung`` too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from stormwatch.chaos.gameday.targets import DetectTarget
from stormwatch.chaos.reports.evidence import AlertEvidence, RankPlacement
from stormwatch.chaos.reports.experiment_report import MATCH_SLACK_SECONDS
from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.faults import REGISTRY, Target

#: The labels by which an alert names where something is wrong.
CULPRIT_LABELS = ("rank", "node", "gpu", "link")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultPlace:
    """Where a fault acted, as alert labels name it.

    Attributes:
        job: the experiment's training job (None: unknown).
        ranks: the ranks it names: a rank fault's rank; for a node fault the rank it was
            given by and every rank the job ran on its nodes.
        nodes: the nodes it acted on (a rank fault: the node holding the rank); None:
            every node (a partition from every other node; a rank fault whose node is
            unknown: a node named is not checked).
        gpu: the faulted GPU's index (GPU faults), else None: any.
        links: the faulted links' indexes (NVLink faults naming links), else None: any.
        node_level: a node fault (a rank named must run on a faulted node), not a rank
            fault (a rank named must be the rank).
    """

    job: str | None = None
    ranks: frozenset[int] = frozenset()
    nodes: frozenset[str] | None = frozenset()
    gpu: str | None = None
    links: frozenset[str] | None = None
    node_level: bool = False

    def names(self, labels: Mapping[str, str]) -> bool:
        """Every culprit label of ``labels`` points here, and no other job is named."""
        if self.other_job(labels):
            return False
        rank = labels.get("rank")
        if rank is not None and not (
            (self.node_level and self.nodes is None) or _int(rank) in self.ranks
        ):
            return False
        node = labels.get("node")
        if node is not None and self.nodes is not None and node not in self.nodes:
            return False
        gpu = labels.get("gpu")
        if gpu is not None and self.gpu is not None and gpu != self.gpu:
            return False
        link = labels.get("link")
        return link is None or self.links is None or link in self.links

    def __str__(self) -> str:
        """``rank 1 on node0``, ``node node1 (ranks 2, 3)``, ``every node``, with the GPU and
        links when it names them."""
        ranks = ", ".join(str(r) for r in sorted(self.ranks))
        nodes = "every node" if self.nodes is None else ", ".join(sorted(self.nodes))
        if self.node_level:
            text = nodes if self.nodes is None else f"node {nodes}"
            text += f" (ranks {ranks})" if ranks and self.nodes is not None else ""
        else:
            text = f"rank {ranks or '?'}" + (f" on {nodes}" if self.nodes else "")
        text += f" GPU {self.gpu}" if self.gpu is not None else ""
        links = ", ".join(sorted(self.links)) if self.links is not None else ""
        return text + (f" link(s) {links}" if links else "")

    def other_job(self, labels: Mapping[str, str]) -> bool:
        """``labels`` name a training job that is not the experiment's."""
        job = labels.get(TRAINING_JOB_LABEL)
        return job is not None and self.job is not None and job != self.job


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def fault_place(
    *,
    kind: str | None,
    spec: object,
    job: str | None,
    rank: int | None,
    node: str | None,
    placements: Sequence[RankPlacement] = (),
) -> FaultPlace:
    """The place of a fault of ``kind``: ``spec`` is its experiment fault (the ledger's, or
    the experiment file's), ``rank``/``node`` where it landed (the journal's
    ``FaultInjected``), ``placements`` which node ran which rank."""
    definition = REGISTRY.get(kind or "")
    target = definition.traits.target if definition is not None else Target.RANK
    gpu = getattr(spec, "gpu", None)
    links = getattr(spec, "links", None)
    link = getattr(spec, "link", None)
    if links is None and link is not None:
        links = [link]
    gpu_index = None if gpu is None else str(gpu)
    link_indexes = None if links is None else frozenset(_strings(links))
    if target is Target.RANK:
        return FaultPlace(
            job=job,
            ranks=frozenset() if rank is None else frozenset({rank}),
            # its node: where it landed, else where the job ran it; unknown: not checked
            nodes=frozenset({node}) if node else _nodes_of(placements, job, rank) or None,
            gpu=gpu_index,
            links=link_indexes,
        )
    target_nodes = getattr(spec, "target_nodes", None)
    named = set(_strings(target_nodes())) if callable(target_nodes) else set()
    named |= {node} if node else set()
    nodes: frozenset[str] | None
    if target is Target.NODE_SETS:
        peers = getattr(spec, "peers", None)
        nodes = None if peers is None else frozenset(named | set(_strings(peers)))
    else:
        nodes = frozenset(named)
    ranks = {rank} if rank is not None else set()
    if nodes is not None:
        ranks |= {p.rank for p in placements if p.training_job == job and p.node in nodes}
    return FaultPlace(
        job=job,
        ranks=frozenset(ranks),
        nodes=nodes,
        gpu=gpu_index,
        links=link_indexes,
        node_level=True,
    )


def _strings(values: Iterable[object]) -> list[str]:
    return [str(v) for v in values]


def _nodes_of(
    placements: Sequence[RankPlacement], job: str | None, rank: int | None
) -> frozenset[str]:
    """The nodes ``rank`` of ``job`` ran on."""
    return frozenset(p.node for p in placements if p.training_job == job and p.rank == rank)


def culprit(labels: Mapping[str, str]) -> dict[str, str]:
    """What an alert names: its :data:`CULPRIT_LABELS` (empty: the job or cluster as a whole)."""
    return {k: labels[k] for k in CULPRIT_LABELS if k in labels}


def culprit_correct(
    alertname: str | None,
    labels: Mapping[str, str],
    *,
    place: FaultPlace,
    target: DetectTarget | None,
    alerts: Sequence[AlertEvidence] = (),
) -> bool | None:
    """Whether the detecting alert named the fault (see the module docstring).

    ``alerts``: every alert that fired during the experiment (for the slow classes'
    "no waiting rank named"). None: nothing detected, or nothing named where the class
    needs nothing named.
    """
    return judge_culprit(alertname, labels, place=place, target=target, alerts=alerts)[0]


def judge_culprit(
    alertname: str | None,
    labels: Mapping[str, str],
    *,
    place: FaultPlace,
    target: DetectTarget | None,
    alerts: Sequence[AlertEvidence] = (),
) -> tuple[bool | None, str]:
    """:func:`culprit_correct`, and why not in words ("" when it is, or is not judged)."""
    if alertname is None:
        return None, ""
    if place.other_job(labels):
        return False, f"{alertname} is about job {labels.get(TRAINING_JOB_LABEL)}"
    named = culprit(labels)
    needs = target.names if target is not None else None
    if (needs == "rank" and "rank" not in named) or (
        needs == "node" and not ({"node", "rank"} & set(named))
    ):
        return False, f"{alertname} names no {needs}"
    if not named:
        return None, ""
    if not place.names(labels):
        return False, f"{alertname} names {_text(named)}, not the fault's {place}"
    if target is not None and target.no_waiting_rank:
        waiting = sorted(
            {
                a.labels["rank"]
                for a in alerts
                if a.alertname == alertname
                and not place.other_job(a.labels)
                and "rank" in a.labels
                and _int(a.labels["rank"]) not in place.ranks
            }
        )
        if waiting:
            return False, f"{alertname} also named waiting rank(s) {', '.join(waiting)}"
    return True, ""


def _text(named: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in named.items())


def false_alarms(
    alerts: Sequence[AlertEvidence],
    *,
    place: FaultPlace,
    expected: Iterable[str],
    fault_at: float | None,
    started_at: float,
    ended_at: float | None,
) -> list[AlertEvidence]:
    """The alerts that fired in ``[started_at, ended_at]`` (no end: every later one) and are
    false alarms (see the module docstring), in firing order."""
    wanted = set(expected)
    found = []
    for alert in sorted(alerts, key=lambda a: a.firing_at):
        if alert.firing_at < started_at or (ended_at is not None and alert.firing_at > ended_at):
            continue
        if place.other_job(alert.labels):
            found.append(alert)
            continue
        after = fault_at is not None and alert.firing_at >= fault_at - MATCH_SLACK_SECONDS
        if alert.alertname in wanted and (after or fault_at is None):
            continue
        if not (after and (not culprit(alert.labels) or place.names(alert.labels))):
            found.append(alert)
    return found


__all__ = [
    "CULPRIT_LABELS",
    "FaultPlace",
    "culprit",
    "culprit_correct",
    "false_alarms",
    "fault_place",
    "judge_culprit",
]
