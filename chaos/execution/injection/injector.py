"""Inject one experiment's faults: wait for the step, locate the rank, ledger first, then send.

The order is the point (FC-13): the ledger row is committed before the fault
leaves the controller, so whatever happens next (crash, Ctrl-C, a timeout on
the request) the fault can be found and reverted. Where a fault goes and how it is
applied there follow its kind's placement (:mod:`.placement`); a kind that does not
revert itself at its TTL (:attr:`stormwatch.faults.Traits.reverts_itself`) gets a
detached TTL reaper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import ChaosError, FaultError, RankNotFound
from stormwatch.chaos.execution.injection.placement import (
    InjectionResult,
    agent_targets,
    apply_fault,
    local_target,
)
from stormwatch.chaos.experiment.model import When
from stormwatch.chaos.ledger.ledger import Ledger
from stormwatch.chaos.ledger.reaper import spawn_reaper
from stormwatch.chaos.target import Target
from stormwatch.contracts.fault_ledger import FaultTarget, LedgerEntry
from stormwatch.contracts.journal import JobRef
from stormwatch.errors import StormwatchError
from stormwatch.faults import ExperimentFault, Placement
from stormwatch.telemetry.ranklogs import read_job_logs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Injected:
    """A fault that took effect: its ledger entry (state ``injected``) and what the target said."""

    entry: LedgerEntry
    result: InjectionResult


class Injector:
    """Sends one experiment's faults to one job.

    Args:
        ledger: where faults are recorded before they are sent.
        agents: HTTP client for agent-side faults.
        target: the agents and job control.
        job: the job under test.
        experiment_id: prefix of the fault ids (``<experiment-id>.<action name>``).
        status: progress callback (one line).
        step_poll_seconds: how often rank logs are read while waiting for a step.
        first_seen_steps: rank -> last completed step when the runner first observed the job
            (a ``when.step`` already behind it is refused, never injected late).
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        agents: AgentClient,
        target: Target,
        job: JobRef,
        experiment_id: str,
        status: Callable[[str], None],
        step_poll_seconds: float,
        first_seen_steps: dict[int, int] | None = None,
    ) -> None:
        self._ledger = ledger
        self._agents = agents
        self._target = target
        self._job = job
        self._experiment_id = experiment_id
        self._status = status
        self._poll = step_poll_seconds
        self._first_seen = dict(first_seen_steps or {})

    async def wait_for_step(self, when: When, rank: int) -> tuple[int, int]:
        """Wait until ``rank`` completed ``when.step``; returns the (step, attempt) seen then.

        Raises:
            FaultError: the trigger was already past when the job was first observed (the
                fault would land late, e.g. on a job that resumed a finished run), the job
                ended first, or ``when.timeout_seconds`` passed.
        """
        job = self._job
        first = max(self._first_seen.values(), default=None)
        if first is not None and first > when.step:
            raise FaultError(
                f"not injected: the trigger when.step={when.step} was already past when job "
                f"{job.name} was first observed (its ranks were at step {first}); start a "
                "fresh job (without --job) or attach before that step"
            )
        deadline = time.monotonic() + when.timeout_seconds
        while True:
            log = read_job_logs(job.log_dir).get(rank)
            last = log.last_step if log is not None else None
            if last is not None and last.step is not None and last.step >= when.step:
                return last.step, last.attempt
            at = last.step if last is not None else 0
            finished = log is not None and log.finished
            if finished or self._target.jobs.exited(job.name) is not None:
                raise FaultError(f"job {job.name} ended at step {at} before step {when.step}")
            if time.monotonic() > deadline:
                raise FaultError(
                    f"rank {rank} did not reach step {when.step} within "
                    f"{when.timeout_seconds:g} s (at step {at})"
                )
            self._status(f"waiting for step {when.step}: rank {rank} at step {at}")
            await asyncio.sleep(self._poll)

    async def locate(self, fault: ExperimentFault, fault_id: str = "") -> list[FaultTarget]:
        """Where ``fault`` can go, most likely first (agents that list the rank alive lead).

        Agent-side kinds get one candidate per request set
        (:func:`~stormwatch.chaos.execution.injection.placement.plan_requests`), their agent ids
        derived from ``fault_id``.

        Raises:
            FaultError: the rank's process cannot be found, a node is unknown, or there
                are no agents.
        """
        job = self._job.name
        if fault.traits.placement is Placement.CONTROLLER:
            return [local_target(fault, job)]
        if not self._target.agents:
            raise FaultError("the target has no node agents")
        token = str(self._target.agent_token_file) if self._target.agent_token_file else None
        rank = fault.target_rank()
        holders = (
            await self._holders(rank) if rank is not None and not fault.target_nodes() else set()
        )
        return agent_targets(
            spec=fault,
            fault_id=fault_id,
            job=job,
            agents=self._target.agents,
            token_file=token,
            holders=sorted(holders),
        )

    async def _holders(self, rank: int) -> set[str]:
        """Nodes that run ``rank`` of the job (the platform backend, else every agent's /v1/ranks)."""
        job = self._job.name
        holders: set[str] = set()
        if self._target.placement is not None:
            try:
                placed = await asyncio.to_thread(self._target.placement.ranks, job)
            except StormwatchError as exc:
                log.warning(
                    "the platform cannot place the ranks of %s (asking each agent): %s", job, exc
                )
            else:
                if rank in placed:
                    holders.add(placed[rank])
        if not holders:  # no backend, or it does not know: ask each agent
            for agent in self._target.agents:
                # An agent that cannot answer (one a fault stopped, say) holds no rank we can
                # reach; holders only order the agents tried, and every one is tried anyway.
                with contextlib.suppress(ChaosError):
                    ranks = await self._agents.ranks(agent.url)
                    if any(r.job == job and r.rank == rank and r.alive for r in ranks):
                        holders.add(agent.node)
        return holders

    async def inject(
        self, name: str, fault: ExperimentFault, *, recorded: Callable[[], None]
    ) -> Injected:
        """Locate, record (``pending``), send, confirm (``injected``); ``recorded()`` runs after
        the ledger write. Faults nothing else reverts get a TTL reaper.

        Raises:
            FaultError: it could not be located or sent (a pending row stays for the revert).
        """
        fault_id = f"{self._experiment_id}.{name}"
        candidates = await self.locate(fault, fault_id)
        self._ledger.record(
            fault_id=fault_id,
            experiment_id=self._experiment_id,
            spec=fault,
            target=candidates[0],
            expires_at=time.time() + fault.ttl_seconds,
        )
        recorded()
        result: InjectionResult | None = None
        for i, target in enumerate(candidates):
            if i:  # the previous agent answered 404: nothing happened there
                self._ledger.retarget(fault_id, target)
            try:
                result = await apply_fault(
                    fault_id=fault_id, spec=fault, target=target, agents=self._agents
                )
                break
            except RankNotFound as exc:
                if i == len(candidates) - 1:
                    raise FaultError(
                        f"no agent accepted {fault.kind} for job {self._job.name}: {exc}"
                    ) from exc
        assert result is not None
        entry = self._ledger.mark_injected(
            fault_id,
            injected_at=result.applied_at,
            expires_at=result.expires_at,
            target_pid=result.target_pid,
        )
        if not fault.traits.reverts_itself:
            spawn_reaper(self._ledger.path, fault_id)
        return Injected(entry, result)


__all__ = ["Injected", "Injector"]
