"""What an experiment runs against: the job, Prometheus, the node agents (:class:`Target`).

:func:`lab_target` builds it from a lab's run directory (``lab.json``, via the
lab's Python API). :class:`AttachedJobs` attaches to jobs started by other
means (their rank logs under ``<run-dir>/jobs/<name>/logs``), for targets
without a lab. The runner only sees :class:`Target` and the
:class:`JobControl` protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from stormwatch.chaos.errors import ChaosError, LabNotReady
from stormwatch.chaos.experiment.model import JobSection
from stormwatch.chaos.node_service import NodeService, SlurmNodes
from stormwatch.clients.http import HttpOptions
from stormwatch.contracts.journal import JobRef
from stormwatch.errors import StormwatchError
from stormwatch.lab import JobSpec, Lab
from stormwatch.lab.jobs import launch as lab_jobs
from stormwatch.platforms.endpoints import AgentEndpoint
from stormwatch.platforms.lab import LabBackend
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands
from stormwatch.telemetry.ranklogs import read_job_logs

logger = logging.getLogger(__name__)


class JobControl(Protocol):
    """Starts or finds training jobs and tells whether they have ended."""

    def start(self, job: JobSection) -> JobRef:
        """Start ``job``; raises ChaosError when it cannot."""
        ...

    def attach(self, name: str) -> JobRef:
        """Find the running (or finished) job ``name``; raises ChaosError when there is none."""
        ...

    def log_dir(self, name: str) -> Path:
        """Where job ``name``'s rank logs are (a baseline's, say: it need not run); raises
        ChaosError when that cannot be known."""
        ...

    def exited(self, name: str) -> bool | None:
        """``None`` while the job runs (or when unknown); ``True``/``False``: ended ok / failed."""
        ...

    def ended(self, name: str) -> bool:
        """Whether every process of the job has exited (torchrun's shutdown included)."""
        ...

    def stop(self, name: str) -> None:
        """Stop the job (SIGTERM, then SIGKILL); raises ChaosError when it cannot."""
        ...


class RankPlacement(Protocol):
    """Where a job's ranks run; every platform backend (``stormwatch.platforms``) is one."""

    def ranks(self, job: str) -> Mapping[int, str]:
        """Global rank -> node name; raises a StormwatchError when the job has no worker."""
        ...


@dataclass(frozen=True, kw_only=True)
class Target:
    """Everything the runner talks to.

    Attributes:
        run_dir: the run directory (ledger in ``chaos/``, journals in ``experiments/``).
        jobs: how jobs are started/attached.
        world_size: ranks per job.
        prometheus_url: Prometheus base URL (None: experiments with Prometheus probes fail).
        prometheus_http: how to reach it (TLS, auth: a target file's ``prometheus.http``);
            None: plain HTTP.
        agents: the node agents (kill_rank needs them;
            :class:`~stormwatch.platforms.AgentEndpoint`).
        agent_token_file: the agents' Bearer token file.
        responder_url / responder_token_file: the responder (post-mortems).
        placement: the platform backend that says which node runs a rank (agent
            faults go to that node's agent first); None: ask every agent.
        attach_job: the job a target file attaches to (``job.attach``): the runner
            attaches to it instead of starting the experiment's job; None: start it.
        nodes: returns nodes to service after the faults on them are reverted (the
            rollbacks and the final revert call it); None: the platform needs nothing.
        description: the target in words, for messages and the dry run
            (``the lab in run``, ``Slurm job 42 (llm) ...``).
        size_fix: how to get a job of another world size here (readiness messages).
        token_fix: how to give the agents' token file (readiness messages).
        agents_are_job_nodes: whether :attr:`agents` are the job's nodes (the lab's, an
            attached job's); False: a job submitted per run lands on nodes not known
            before it starts (the agents are every node's).
    """

    run_dir: Path
    jobs: JobControl
    world_size: int
    prometheus_url: str | None = None
    prometheus_http: HttpOptions | None = None
    agents: tuple[AgentEndpoint, ...] = field(default_factory=tuple)
    agent_token_file: Path | None = None
    responder_url: str | None = None
    responder_token_file: Path | None = None
    placement: RankPlacement | None = None
    attach_job: str | None = None
    nodes: NodeService | None = None
    description: str = "the lab"
    size_fix: str = "bring up a lab of that size"
    token_fix: str = "bring the lab up again (`stormwatch lab up` writes it)"
    agents_are_job_nodes: bool = True


class AttachedJobs:
    """Jobs started by other means; their logs are in ``<run-dir>/jobs/<name>/logs``.

    ``start`` is not supported; a job has ended when every rank logged ``done``.
    """

    def __init__(self, run_dir: Path, *, world_size: int) -> None:
        self._run_dir = Path(run_dir)
        self._world_size = world_size

    def log_dir(self, name: str) -> Path:
        return self._run_dir / "jobs" / name / "logs"

    def start(self, job: JobSection) -> JobRef:
        raise ChaosError(f"cannot start job {job.name!r} here: attach to a running job instead")

    def attach(self, name: str) -> JobRef:
        log_dir = self.log_dir(name)
        if not log_dir.is_dir():
            raise LabNotReady(f"no job {name!r}: {log_dir} does not exist")
        return JobRef(
            name=name, log_dir=log_dir, world_size=self._world_size, started_by_runner=False
        )

    def exited(self, name: str) -> bool | None:
        logs = read_job_logs(self.log_dir(name))
        if len(logs) >= self._world_size and all(log.finished for log in logs.values()):
            return True
        return None

    def ended(self, name: str) -> bool:
        return self.exited(name) is not None

    def stop(self, name: str) -> None:
        raise ChaosError(f"cannot stop job {name!r}: it was not started by stormwatch chaos")


class LabJobs:
    """Jobs on a lab, through the lab's Python API (``stormwatch.lab.Lab``)."""

    def __init__(self, lab: Lab, *, world_size: int) -> None:
        self._lab = lab
        self._world_size = world_size

    def start(self, job: JobSection) -> JobRef:
        """Start ``job`` under its own name; refuses a name the lab already has a job of
        (its folder holds that run's logs and checkpoints, which a new run would resume)."""
        try:
            existing = self._lab.state.jobs.get(job.name)
        except StormwatchError as exc:
            raise LabNotReady(str(exc)) from exc
        if existing is not None:
            raise ChaosError(
                f"the lab already has a job {job.name!r} ({existing.info.job_dir}); a new run "
                "would resume its checkpoints and append to its rank logs. Choose another "
                "job.name, or attach to it with --job"
            )
        try:
            spec = JobSpec(
                name=job.name,
                steps=job.steps,
                checkpoint_every=job.checkpoint_every,
                seed=job.seed,
                step_delay=job.step_delay,
                min_nodes=job.min_nodes,
                global_batch=job.global_batch,
                command=job.command_line(),
            )
            info = self._lab.start_job(spec)
        except StormwatchError as exc:
            raise ChaosError(f"could not start job {job.name!r} on the lab: {exc}") from exc
        return JobRef(
            name=info.name,
            log_dir=Path(info.log_dir),
            world_size=self._world_size,
            started_by_runner=True,
        )

    def log_dir(self, name: str) -> Path:
        return self._lab.paths.job_logs(name)

    def attach(self, name: str) -> JobRef:
        try:
            state = self._lab.state
        except StormwatchError as exc:
            raise LabNotReady(str(exc)) from exc
        record = state.jobs.get(name)
        if record is None:
            known = ", ".join(sorted(state.jobs)) or "none"
            raise LabNotReady(f"no job {name!r} in the lab at {state.run_dir} (jobs: {known})")
        return JobRef(
            name=name,
            log_dir=Path(record.info.log_dir),
            world_size=self._world_size,
            started_by_runner=False,
        )

    def exited(self, name: str) -> bool | None:
        """Ended ok / failed; ``None`` while it runs. A job whose survivors wait for a lost
        node forever has failed; an elastic one that shrank has not (:func:`jobs.stranded`)."""
        try:
            record = self._lab.state.job(name)
        except StormwatchError:
            return None
        result = lab_jobs.result(record)
        if result.exit_codes and all(c is not None for c in result.exit_codes.values()):
            return result.ok
        if record.info.spec.min_nodes is None:
            if any(code not in (None, 0) for code in result.exit_codes.values()):
                return False
            return None
        return False if lab_jobs.stranded(record) is not None else None

    def ended(self, name: str) -> bool:
        try:
            codes = self._lab.job_result(name).exit_codes
        except StormwatchError:
            return True
        return all(code is not None for code in codes.values())

    def stop(self, name: str) -> None:
        try:
            self._lab.stop_job(name)
        except StormwatchError as exc:
            raise ChaosError(f"could not stop job {name!r}: {exc}") from exc


def lab_target(run_dir: Path) -> Target:
    """The :class:`Target` of the lab in ``run_dir``.

    Raises:
        LabNotReady: there is no lab there, or it is not up.
    """
    lab = Lab(Path(run_dir))
    try:
        state = lab.state
    except StormwatchError as exc:
        raise LabNotReady(f"{exc}") from exc
    if state.phase != "up":
        raise LabNotReady(
            f"the lab in {run_dir} is {state.phase!r}, not 'up'; "
            f"start it with `stormwatch lab up --run-dir {run_dir}`"
        )
    return Target(
        run_dir=Path(state.run_dir),
        jobs=LabJobs(lab, world_size=state.config.world_size),
        world_size=state.config.world_size,
        prometheus_url=state.prometheus_url,
        # The nodes a lab job runs on (the first ``job_nodes``; the default lab's third
        # node is a spare that no job uses until one is moved there).
        agents=tuple(
            AgentEndpoint(node=n.name, url=n.agent_url, fault_url=n.agent_fault_url)
            for n in state.nodes[: state.config.job_nodes]
        ),
        agent_token_file=Path(state.agent_token_file),
        responder_url=state.responder_url,
        responder_token_file=Path(state.responder_token_file),
        description=f"the lab in {run_dir}",
        placement=LabBackend(
            diagnostics_dir=Path(state.run_dir) / "chaos" / "diagnostics",
            node_metrics_dirs={n.name: Path(n.metrics_dir) for n in state.nodes},
        ),
        # The lab's Slurm sets a node cut off for SlurmdTimeout DOWN: resumed after a revert.
        nodes=None
        if state.slurm is None
        else SlurmNodes(
            SlurmBackend(
                diagnostics_dir=Path(state.run_dir) / "chaos" / "diagnostics",
                commands=SlurmCommands(conf=state.slurm.conf),
            )
        ),
    )


__all__ = [
    "AttachedJobs",
    "JobControl",
    "LabJobs",
    "RankPlacement",
    "Target",
    "lab_target",
]
