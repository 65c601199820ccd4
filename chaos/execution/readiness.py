"""Before anything is written or started: do the services an experiment needs answer?

And, once its job is started: wait until every rank has completed a step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import FaultError, LabNotReady
from stormwatch.chaos.experiment.model import (
    ActionActivity,
    Experiment,
    ProbeActivity,
    PrometheusProvider,
)
from stormwatch.chaos.experiment.selection import rank_range
from stormwatch.chaos.target import JobControl, Target
from stormwatch.clients import AsyncPrometheusClient, PrometheusAPIError
from stormwatch.contracts.journal import JobRef
from stormwatch.faults import Placement
from stormwatch.telemetry.ranklogs import read_job_logs


async def preflight(
    experiment: Experiment,
    target: Target,
    *,
    prometheus: AsyncPrometheusClient | None,
    agents: AgentClient,
) -> None:
    """Check Prometheus (if probes query it), the fault ranks, and the agents (for the kinds
    that ask the rank's agent directly: ``kill_rank``).

    Raises:
        LabNotReady: naming what is missing or down.
    """
    probes = [p.provider for p in experiment.steady_state_hypothesis.probes]
    probes += [a.provider for a in experiment.method if isinstance(a, ProbeActivity)]
    probes += [a.provider for a in experiment.rollbacks if isinstance(a, ProbeActivity)]
    if any(isinstance(p, PrometheusProvider) for p in probes):
        if prometheus is None:
            raise LabNotReady("the experiment queries Prometheus but the target has none")
        try:
            await prometheus.query("vector(1)")
        except PrometheusAPIError as exc:
            raise LabNotReady(f"Prometheus does not answer: {exc}") from exc
    faults = [a.fault for a in experiment.method if isinstance(a, ActionActivity)]
    fixed = experiment.job.fixed_world_size
    if fixed is not None and fixed != target.world_size:
        raise LabNotReady(
            f"the experiment's job has {fixed} ranks (job section) but {target.description} "
            f"runs {target.world_size}: {target.size_fix}, or fix the job section"
        )
    known_nodes = {agent.node for agent in target.agents}
    for fault in faults:
        rank = fault.target_rank()
        if rank is not None and rank >= target.world_size:
            raise LabNotReady(
                f"{fault.kind}: rank {rank} does not exist (world size "
                f"{target.world_size}: {'rank' if target.world_size == 1 else 'ranks'} "
                f"{rank_range(target.world_size)})"
            )
        unknown = [node for node in fault.target_nodes() if node not in known_nodes]
        if known_nodes and unknown:
            raise LabNotReady(
                f"{fault.kind}: node {', '.join(unknown)} is not in {target.description} "
                f"(nodes: {', '.join(sorted(known_nodes))})"
            )
    direct = [f.kind for f in faults if f.traits.placement is Placement.RANK_AGENT]
    if direct:
        if not target.agents:
            raise LabNotReady(f"{direct[0]} needs node agents; {target.description} has none")
        if target.agent_token_file is None:
            raise LabNotReady(f"{direct[0]} needs the node agents' token file: {target.token_fix}")
        down = [a.node for a in target.agents if not await agents.healthy(a.url)]
        if down:
            raise LabNotReady(f"agents not answering /healthz on: {', '.join(down)}")


async def wait_until_stepping(
    job: JobRef, jobs: JobControl, *, timeout: float, status: Callable[[str], None]
) -> dict[int, int]:
    """Wait until every rank of ``job`` has logged a completed step.

    Returns:
        rank -> the last step it had completed then (each rank with a log and a step).

    Raises:
        FaultError: the job ended first, or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        logs = read_job_logs(job.log_dir)
        stepped = [r for r in range(job.world_size) if r in logs and logs[r].steps]
        if len(stepped) == job.world_size:
            lasts = {rank: log.last_step for rank, log in logs.items()}
            return {r: e.step for r, e in lasts.items() if e is not None and e.step is not None}
        if jobs.exited(job.name) is not None:
            raise FaultError(f"job {job.name} ended before every rank stepped")
        if time.monotonic() > deadline:
            raise FaultError(
                f"job {job.name}: only {len(stepped)}/{job.world_size} ranks stepped within "
                f"{timeout:g} s (job.startup_timeout_seconds)"
            )
        status(
            f"waiting for job {job.name} to start: {len(stepped)}/{job.world_size} ranks stepping"
        )
        await asyncio.sleep(0.5)


__all__ = ["preflight", "wait_until_stepping"]
