"""Remedial and diagnostic actions carried out through a :class:`PlatformBackend`.

Each action reads what it acts on from the incident's labels (``training_job``; ``node``
from the incident or its first alert) and calls one backend method on a worker
thread. None is retry-safe except ``collect_diagnostics`` and ``notify_only``:
an interrupted restart is not repeated after a responder restart (at most once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from stormwatch.alerts.actions.base import Action, ActionOutcome
from stormwatch.clients.errors import PrometheusAPIError
from stormwatch.clients.prometheus import AsyncPrometheusAPI, promql_string
from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.contracts.responder import IncidentRecord
from stormwatch.platforms import PlatformBackend

log = logging.getLogger(__name__)

#: The alert that says a node answers nothing (alerts/rules/nodes.yml).
NODE_DOWN = "StormwatchNodeDown"
#: The alerts of a hang, whose evidence the node agents collect when they see it.
HANG_ALERTS = frozenset(
    {"StormwatchTrainingHung", "StormwatchRankStalled", "StormwatchRankHungInPhase"}
)
#: Seconds after a hang alert starts firing before an action may stop the job's ranks. The
#: node agents detect the hang at the same threshold as the rules and ask each hung rank
#: for its flight-recorder dump, waiting up to 5 s for the answers
#: (``stormwatch.agent.watch.hangdumps.DUMP_WAIT_SECONDS``); a stop before that changes
#: what the ranks show (Slurm sends SIGCONT, then SIGTERM: a stopped rank runs on into
#: the collective its peers wait in, and no rank is behind any more). 5 s, a scan (1 s),
#: and a scrape's worth of margin.
EVIDENCE_WAIT_S = 7.0
#: How far back a job's ranks are looked up on nodes (their series go stale when the node
#: stops answering; :func:`unreachable_nodes`).
JOB_NODES_LOOKBACK = "10m"


async def unreachable_nodes(prometheus: AsyncPrometheusAPI, job: str) -> list[str]:
    """The nodes that ran ranks of ``job`` in the last :data:`JOB_NODES_LOOKBACK` and for
    which :data:`NODE_DOWN` is pending or firing now (its first failed scrape makes it
    pending), sorted.

    Raises:
        PrometheusAPIError: Prometheus could not be reached or rejected the query.
    """
    expr = (
        f'group by (node) (ALERTS{{alertname="{NODE_DOWN}"}})'
        " and on (node) group by (node) (last_over_time("
        f"stormwatch_rank_up{{{TRAINING_JOB_LABEL}={promql_string(job)}}}[{JOB_NODES_LOOKBACK}]))"
    )
    return sorted({s.labels["node"] for s in await prometheus.query(expr) if s.labels.get("node")})


def incident_job(incident: IncidentRecord) -> str | None:
    """The training job an incident is about (its or its first alert's ``training_job``
    label), or None."""
    return incident.labels.get(TRAINING_JOB_LABEL) or incident.first_alert.labels.get(
        TRAINING_JOB_LABEL
    )


def incident_node(incident: IncidentRecord) -> str | None:
    """The node an incident is about (its or its first alert's ``node`` label), or None."""
    return incident.labels.get("node") or incident.first_alert.labels.get("node")


@dataclass(frozen=True)
class _BackendAction(Action):
    """An action through the platform backend.

    Attributes:
        backend: the platform it acts through.
        prometheus: where the actions that stop ranks (:attr:`Action.stops_ranks`) check,
            before they run, that every node of the job answers (:meth:`precheck`); None:
            not checked.
        evidence_wait: seconds after a hang alert started before those actions run
            (:data:`EVIDENCE_WAIT_S`).
        clock: Unix time source.
    """

    backend: PlatformBackend
    prometheus: AsyncPrometheusAPI | None = None
    evidence_wait: float = EVIDENCE_WAIT_S
    clock: Callable[[], float] = time.time

    def describe(self, incident: IncidentRecord) -> str:
        """What the action would do (for dry-run and approval messages)."""
        return f"{self.kind} for job {incident_job(incident)}"

    def guard(self, incident: IncidentRecord) -> str | None:
        if incident_job(incident) is None:
            return f"{self.kind}: the incident has no job label"
        return None

    async def precheck(self, incident: IncidentRecord) -> str | None:
        """A restart waits for a hang's evidence, and for the scheduler while a node of
        the job is unreachable.

        An action that stops ranks for a hang alert (:data:`HANG_ALERTS`) starts no sooner
        than :data:`EVIDENCE_WAIT_S` after the alert started firing: the node agents are
        collecting the hung ranks' flight recorders meanwhile.

        The ranks on a node that answers nothing cannot be stopped, so a restart in place
        cannot complete (a Slurm requeue stays COMPLETING until Slurm sets the node DOWN;
        Slurm 22.05 then fails the job instead of starting it). The node's loss is the
        scheduler's case: Slurm requeues the job on NODE_FAIL (``--requeue``), Kubernetes
        replaces the pod, torchrun's rendezvous goes on without the node. An action that
        stops ranks is skipped while :data:`NODE_DOWN` is pending or firing for a node that
        ran ranks of the job (:func:`unreachable_nodes`). When Prometheus cannot answer,
        the action runs (logged): the check never holds a remedy back on its own failure.
        """
        job = incident_job(incident)
        if not self.stops_ranks:
            return None
        if incident.alertname in HANG_ALERTS:
            early = incident.starts_at + self.evidence_wait - self.clock()
            if early > 0:
                log.info(
                    "%s for job %s: %.1f s for the hang's evidence first", self.kind, job, early
                )
                await asyncio.sleep(early)
        if self.prometheus is None or job is None:
            return None
        try:
            nodes = await unreachable_nodes(self.prometheus, job)
        except PrometheusAPIError as exc:
            log.warning("%s for job %s: node check skipped: %s", self.kind, job, exc)
            return None
        if not nodes:
            return None
        return (
            f"{self.kind}: node(s) {', '.join(nodes)} of job {job} unreachable ({NODE_DOWN}); "
            "a node's loss is the scheduler's to handle (Slurm requeues on NODE_FAIL, "
            "Kubernetes replaces the pod), and ranks there cannot be stopped"
        )

    async def _on_job(
        self, incident: IncidentRecord, call: Callable[..., str], *args: object
    ) -> ActionOutcome:
        """``call(job, *args)`` on a worker thread; its answer is the outcome's detail."""
        job = incident_job(incident) or ""
        detail = await asyncio.to_thread(call, job, *args)
        return ActionOutcome(status="succeeded", detail=detail, data={"job": job})


@dataclass(frozen=True)
class RestartWorkers(_BackendAction):
    """Restart the job's workers at the same world size."""

    kind: ClassVar[str] = "restart_workers"
    stops_ranks: ClassVar[bool] = True

    async def run(self, incident: IncidentRecord) -> ActionOutcome:
        return await self._on_job(incident, self.backend.restart_workers)


@dataclass(frozen=True)
class ExcludeNodeRestart(_BackendAction):
    """Take the incident's node out of the job and restart at a smaller world size."""

    kind: ClassVar[str] = "exclude_node_restart"
    stops_ranks: ClassVar[bool] = True

    def describe(self, incident: IncidentRecord) -> str:
        return f"exclude node {incident_node(incident)} from job {incident_job(incident)}"

    def guard(self, incident: IncidentRecord) -> str | None:
        if incident_node(incident) is None:
            return f"{self.kind}: the incident has no node label"
        return super().guard(incident)

    async def run(self, incident: IncidentRecord) -> ActionOutcome:
        job, node = incident_job(incident) or "", incident_node(incident) or ""
        detail = await asyncio.to_thread(self.backend.exclude_node_and_restart, job, node)
        return ActionOutcome(status="succeeded", detail=detail, data={"job": job, "node": node})


@dataclass(frozen=True)
class CheckpointNow(_BackendAction):
    """Ask the job to save a checkpoint after its current step."""

    kind: ClassVar[str] = "checkpoint_now"

    async def run(self, incident: IncidentRecord) -> ActionOutcome:
        return await self._on_job(incident, self.backend.request_checkpoint)


@dataclass(frozen=True)
class CollectDiagnostics(_BackendAction):
    """Gather the job's workers' stacks and state (read-only, retry-safe)."""

    kind: ClassVar[str] = "collect_diagnostics"
    retry_safe: ClassVar[bool] = True

    async def run(self, incident: IncidentRecord) -> ActionOutcome:
        return await self._on_job(incident, self.backend.collect_diagnostics, incident.id)


class NotifyOnly(Action):
    """Record the incident and do nothing else (the audit log says so)."""

    kind: ClassVar[str] = "notify_only"
    retry_safe: ClassVar[bool] = True

    async def run(self, incident: IncidentRecord) -> ActionOutcome:
        return ActionOutcome(status="succeeded", detail=f"notified: {incident.alertname}")


#: The kinds of the actions that end the job's rank processes (:attr:`Action.stops_ranks`).
RANK_STOPPING_KINDS: frozenset[str] = frozenset(
    a.kind for a in (RestartWorkers, ExcludeNodeRestart) if a.stops_ranks
)

__all__ = [
    "EVIDENCE_WAIT_S",
    "HANG_ALERTS",
    "NODE_DOWN",
    "RANK_STOPPING_KINDS",
    "CheckpointNow",
    "CollectDiagnostics",
    "ExcludeNodeRestart",
    "NotifyOnly",
    "RestartWorkers",
    "incident_job",
    "incident_node",
    "unreachable_nodes",
]
