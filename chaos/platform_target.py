"""The runner's :class:`~stormwatch.chaos.target.Target` from a target file
(:mod:`stormwatch.platforms.targets`): the lab, a Slurm job, or Kubernetes pods.

* ``lab``, or any target with a ``lab:`` section (the ``slurm`` target the Slurm lab's
  ``lab up`` writes): :func:`~stormwatch.chaos.target.lab_target` of the file's
  ``lab.run_dir``: experiment jobs start through the lab (``Lab.start_job``, ``sbatch`` on
  the Slurm lab).
* ``slurm``: the attached job (``job.attach``: ``scontrol show job <id>``, or the running
  job of that name, ``squeue``), its nodes (``scontrol show hostnames``), one agent per
  node at ``<scheme>://<host>:<port>`` (``host`` from ``{node}`` / ``{addr}``, Slurm's
  ``NodeAddr``), rank placement from :class:`~stormwatch.platforms.slurm.SlurmBackend`,
  job state from ``scontrol show job`` (:class:`SlurmJobs`). After a revert, a node that
  slurmctld set DOWN as not responding during the fault is resumed
  (:class:`~stormwatch.chaos.node_service.SlurmNodes`).
  Every command goes through :class:`~stormwatch.platforms.slurm.SlurmCommands` (the
  file's ``slurm.conf``).
* ``kubernetes``: :mod:`stormwatch.chaos.platform_target_kubernetes` (attach to a Job,
  indexed Job, JobSet or pods by label, or submit one from a manifest template).

A Slurm target attaches to a running job (``job.attach``) or submits one per run from a
batch script template (``job.submit``, :mod:`stormwatch.chaos.slurm_submit`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stormwatch.chaos.errors import ChaosError, LabNotReady
from stormwatch.chaos.experiment.model import JobSection
from stormwatch.chaos.node_service import SlurmNodes
from stormwatch.chaos.slurm_submit import SLURM_FAILED, SubmittedSlurmJobs
from stormwatch.chaos.target import JobControl, Target, lab_target
from stormwatch.contracts.journal import JobRef
from stormwatch.lab.paths import RunPaths
from stormwatch.platforms.endpoints import AgentEndpoint
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands, parse_oneliner
from stormwatch.platforms.slurm_readback import SlurmStop, SlurmWait
from stormwatch.platforms.targets import AgentsSection, TargetFile, load_target_file

if TYPE_CHECKING:
    from stormwatch.platforms.kubernetes import KubernetesBackend  # the client is optional

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttachedSlurmJob:
    """The Slurm job a target attaches to: id, name and nodes (node-rank order)."""

    job_id: str
    name: str
    nodes: tuple[str, ...]


class SlurmJobs:
    """The :class:`~stormwatch.chaos.target.JobControl` of one attached Slurm job.

    ``start`` and ``stop`` refuse (the job was not started here); ``exited`` reads
    ``JobState``: ``COMPLETED`` is True, a failed end state False, anything else None.
    """

    def __init__(
        self,
        commands: SlurmCommands,
        job: AttachedSlurmJob,
        *,
        log_dirs: JobLogDirs,
        world_size: int,
    ) -> None:
        self._commands = commands
        self._job = job
        self._log_dirs = log_dirs
        self._log_dir = log_dirs(job.name, job.job_id)
        self._world_size = world_size
        #: The job name the runner attaches to.
        self.attached = job.name

    def log_dir(self, name: str) -> Path:
        """Job ``name``'s rank logs (``job.log_dir``; ``{jobid}``: the newest Slurm job of
        that name, ``scontrol show job``).

        Raises:
            LabNotReady: the pattern needs the job id and Slurm knows no job ``name``.
        """
        if name == self._job.name:
            return self._log_dir
        if not self._log_dirs.needs_job_id:
            return self._log_dirs(name, "")
        try:
            known = self._commands.jobs_named(name)
        except BackendError as exc:
            raise LabNotReady(f"job {name!r}: {exc}") from exc
        if not known:
            raise LabNotReady(f"job.log_dir needs the id of job {name!r}; Slurm knows none")
        return self._log_dirs(name, known[-1].job_id)

    def start(self, job: JobSection) -> JobRef:
        raise ChaosError(
            f"cannot start job {job.name!r}: the target attaches to Slurm job "
            f"{self._job.job_id} ({self._job.name}); run with --job {self._job.name}"
        )

    def attach(self, name: str) -> JobRef:
        if name != self._job.name:
            raise LabNotReady(
                f"no job {name!r} on this target: it attaches to Slurm job "
                f"{self._job.job_id} ({self._job.name})"
            )
        return JobRef(
            name=name, log_dir=self._log_dir, world_size=self._world_size, started_by_runner=False
        )

    def exited(self, name: str) -> bool | None:
        try:
            state = self._commands.job(self._job.job_id).state
        except BackendError as exc:
            logger.warning("Slurm job %s: state unknown: %s", self._job.job_id, exc)
            return None
        if state == "COMPLETED":
            return True
        return False if state in SLURM_FAILED else None

    def ended(self, name: str) -> bool:
        return self.exited(name) is not None

    def stop(self, name: str) -> None:
        raise ChaosError(f"cannot stop job {name!r}: it was not started by stormwatch chaos")


def attach_slurm_job(commands: SlurmCommands, target: TargetFile) -> AttachedSlurmJob:
    """The running job ``job.attach`` names.

    Raises:
        LabNotReady: no such running job, or a Slurm command failed.
    """
    attach = target.job.attach if target.job is not None else None
    if attach is None:
        raise LabNotReady("the target file gives no job.attach to attach to")
    try:
        if attach.id is not None:
            info = commands.job(attach.id)
            if info.state != "RUNNING":
                raise LabNotReady(f"Slurm job {attach.id} is {info.state}, not RUNNING")
            return AttachedSlurmJob(info.job_id, info.name, commands.hostnames(info.nodes))
        name = attach.name or ""
        found = _slurm_backend(commands, target, Path(".")).find(name)
        return AttachedSlurmJob(found.job_id, name, found.nodes)
    except BackendError as exc:
        raise LabNotReady(f"target job {attach.id or attach.name}: {exc}") from exc


def _slurm_backend(commands: SlurmCommands, target: TargetFile, run_dir: Path) -> SlurmBackend:
    return SlurmBackend(
        diagnostics_dir=run_dir / "chaos" / "diagnostics",
        nproc_per_node=target.slurm.nproc_per_node,
        control_dir=target.slurm.control_dir,
        commands=commands,
        wait=SlurmWait(timeout_s=target.slurm.readback_timeout_s),
        stop=SlurmStop(grace_s=target.grace_period_s),
    )


def _agent(agents: AgentsSection, node: str, host: str) -> AgentEndpoint:
    return AgentEndpoint.on_host(
        node, host, port=agents.port, fault_port=agents.fault_port, scheme=agents.scheme
    )


@dataclass(frozen=True)
class JobLogDirs:
    """Where a job's rank logs are: the target file's ``job.log_dir`` (``{job}``,
    ``{jobid}`` substituted), else ``<run-dir>/jobs/<job>/logs``."""

    pattern: str | None
    run_dir: Path

    @classmethod
    def of(cls, target: TargetFile, run_dir: Path) -> JobLogDirs:
        return cls(target.job.log_dir if target.job is not None else None, Path(run_dir))

    @property
    def needs_job_id(self) -> bool:
        return self.pattern is not None and "{jobid}" in self.pattern

    def __call__(self, name: str, job_id: str) -> Path:
        if self.pattern is None:
            return self.run_dir / "jobs" / name / "logs"
        return Path(self.pattern.format(job=name, jobid=job_id))


def _node_addrs(commands: SlurmCommands, host: str) -> dict[str, str]:
    """Every node slurmctld knows -> its ``NodeAddr`` (``scontrol show node``).

    Raises:
        LabNotReady: the command failed.
    """
    try:
        records = parse_oneliner(commands(["scontrol", "--oneliner", "show", "node"]))
    except BackendError as exc:
        raise LabNotReady(f"agents.host {host}: {exc}") from exc
    return {r["NodeName"]: r.get("NodeAddr", r["NodeName"]) for r in records if "NodeName" in r}


def slurm_target(
    target: TargetFile, run_dir: Path, *, commands: SlurmCommands | None = None
) -> Target:
    """The :class:`Target` of a ``slurm`` target file (module docstring): attached to the
    running job ``job.attach`` names (the agents of its nodes), or submitting each job
    from ``job.submit`` (:class:`~stormwatch.chaos.slurm_submit.SubmittedSlurmJobs`; the
    agents of every node, since the allocation is not known yet).

    Raises:
        LabNotReady: the job is not running, the template is unreadable, or a Slurm
            command failed.
    """
    commands = commands or SlurmCommands(conf=target.slurm.conf)
    agents = target.agents
    backend = _slurm_backend(commands, target, run_dir)
    log_dirs = JobLogDirs.of(target, run_dir)
    submit = target.job.submit if target.job is not None else None
    jobs: SlurmJobs | SubmittedSlurmJobs
    if submit is not None:
        addrs = _node_addrs(commands, agents.host)
        nodes: tuple[str, ...] = tuple(sorted(addrs))
        jobs = SubmittedSlurmJobs(
            commands,
            submit,
            log_dirs=log_dirs,
            nproc_per_node=target.slurm.nproc_per_node,
            # Slurm's SIGKILL comes KillWait (<= grace_period_s) after scancel's SIGTERM.
            stop_timeout_s=target.grace_period_s + target.slurm.readback_timeout_s,
        )
        world_size, attached = jobs.world_size, None
        words = (
            f"a job of {submit.template.name} ({jobs.nodes} node(s), its #SBATCH --nodes, x "
            f"{target.slurm.nproc_per_node} ranks, slurm.nproc_per_node)",
            "change the template's #SBATCH --nodes or slurm.nproc_per_node",
        )
    else:
        job = attach_slurm_job(commands, target)
        addrs = _node_addrs(commands, agents.host) if "{addr}" in agents.host else {}
        nodes = job.nodes
        world_size = len(job.nodes) * target.slurm.nproc_per_node
        jobs = SlurmJobs(commands, job, log_dirs=log_dirs, world_size=world_size)
        attached = job.name
        words = (
            f"Slurm job {job.job_id} ({job.name}: {len(nodes)} node(s) x "
            f"{target.slurm.nproc_per_node} ranks, slurm.nproc_per_node)",
            "attach to a job of that size (job.attach) or fix slurm.nproc_per_node",
        )
    endpoints = tuple(
        _agent(agents, n, agents.host.format(node=n, addr=addrs.get(n, n))) for n in nodes
    )
    return build_target(
        target,
        run_dir,
        jobs=jobs,
        world_size=world_size,
        agents=endpoints,
        placement=backend,
        attach_job=attached,
        nodes=SlurmNodes(backend),
        words=words,
    )


def build_target(
    target: TargetFile,
    run_dir: Path,
    *,
    jobs: JobControl,
    world_size: int,
    agents: tuple[AgentEndpoint, ...],
    placement: SlurmBackend | KubernetesBackend,
    attach_job: str | None,
    nodes: SlurmNodes | None = None,
    words: tuple[str, str],
) -> Target:
    """The :class:`Target` of a platform target file, from what the platform found: its
    job control, world size, agents and placement; ``attach_job``: the job to attach to
    (None: the runner starts one); ``words``: the target and how to change its job's
    size, in words (:attr:`Target.description`, :attr:`Target.size_fix`)."""
    creds = target.credentials
    return Target(
        run_dir=Path(run_dir),
        jobs=jobs,
        world_size=world_size,
        prometheus_url=target.prometheus.url if target.prometheus is not None else None,
        prometheus_http=target.prometheus.http if target.prometheus is not None else None,
        agents=agents,
        agent_token_file=creds.agent_token_file,
        responder_url=creds.responder_url,
        responder_token_file=creds.responder_token_file,
        placement=placement,
        attach_job=attach_job,
        nodes=nodes,
        description=words[0],
        size_fix=words[1],
        token_fix="set credentials.agent_token_file in the target file",
        agents_are_job_nodes=attach_job is not None,
    )


def target_from_file(target: TargetFile, run_dir: Path) -> Target:
    """The :class:`Target` of ``target`` (module docstring); ``run_dir`` holds the ledger
    and the experiments (a ``lab`` target uses its own ``lab.run_dir``).

    Raises:
        LabNotReady: the lab is not up, the job is not running, or the platform failed.
    """
    if target.lab is not None:  # a lab (platform lab, or the Slurm lab's slurm target)
        return lab_target(target.lab.run_dir)
    if target.platform == "kubernetes":
        # imported here: that module builds on this one's build_target and JobLogDirs
        from stormwatch.chaos.platform_target_kubernetes import kubernetes_target

        return kubernetes_target(target, run_dir)
    return slurm_target(target, run_dir)


def resolve_target(run_dir: Path, target_file: Path | None) -> Target:
    """What ``--run-dir`` and ``--target`` name: the target file when given, else the one
    ``lab up`` wrote (``<run-dir>/target.yaml``), else the lab in ``run_dir``.

    Raises:
        InvalidTargetFile: the target file is not valid.
        LabNotReady: see :func:`target_from_file`.
    """
    path = target_file if target_file is not None else RunPaths.of(run_dir).target_file
    if target_file is None and not path.is_file():
        return lab_target(run_dir)
    return target_from_file(load_target_file(path), run_dir)


__all__ = [
    "AttachedSlurmJob",
    "JobLogDirs",
    "SlurmJobs",
    "attach_slurm_job",
    "build_target",
    "resolve_target",
    "slurm_target",
    "target_from_file",
]
