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
  job state from ``scontrol show job`` (:class:`SlurmJobs`). Every command goes through
  :class:`~stormwatch.platforms.slurm.SlurmCommands` (the file's ``slurm.conf``).
* ``kubernetes``: agents are the running pods of the agent DaemonSet (``agents.selector``)
  at ``<scheme>://<pod IP>:<port>``; the job's pods and placement from
  :class:`~stormwatch.platforms.kubernetes.KubernetesBackend` (:class:`KubernetesJobs`).

Only ``job.attach`` is supported here; ``job.submit`` is refused when the target is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stormwatch.chaos.errors import ChaosError, LabNotReady
from stormwatch.chaos.experiment.model import JobSection
from stormwatch.chaos.target import AgentEndpoint, Target, lab_target
from stormwatch.contracts.journal import JobRef
from stormwatch.lab.paths import RunPaths
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands, parse_oneliner
from stormwatch.platforms.slurm_readback import SlurmWait
from stormwatch.platforms.targets import AgentsSection, TargetFile, load_target_file

if TYPE_CHECKING:
    from stormwatch.platforms.kubernetes import KubernetesBackend

logger = logging.getLogger(__name__)

#: Slurm job states after which the job will not run again (``squeue --help``, JOB STATE CODES).
_SLURM_FAILED = frozenset(
    {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)


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
        self, commands: SlurmCommands, job: AttachedSlurmJob, *, log_dir: Path, world_size: int
    ) -> None:
        self._commands = commands
        self._job = job
        self._log_dir = log_dir
        self._world_size = world_size
        #: The job name the runner attaches to.
        self.attached = job.name

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
        return False if state in _SLURM_FAILED else None

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
        raise LabNotReady("job.submit is not supported yet; attach to a running job (job.attach)")
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
    )


def _agent(agents: AgentsSection, node: str, host: str) -> AgentEndpoint:
    fault = f"{agents.scheme}://{host}:{agents.fault_port}" if agents.fault_port else None
    return AgentEndpoint(node=node, url=f"{agents.scheme}://{host}:{agents.port}", fault_url=fault)


def _log_dir(target: TargetFile, run_dir: Path, name: str, job_id: str) -> Path:
    pattern = target.job.log_dir if target.job is not None else None
    if pattern is None:
        return Path(run_dir) / "jobs" / name / "logs"
    return Path(pattern.format(job=name, jobid=job_id))


def slurm_target(
    target: TargetFile, run_dir: Path, *, commands: SlurmCommands | None = None
) -> Target:
    """The :class:`Target` of a ``slurm`` target file (module docstring).

    Raises:
        LabNotReady: the job is not running, or a Slurm command failed.
    """
    commands = commands or SlurmCommands(conf=target.slurm.conf)
    job = attach_slurm_job(commands, target)
    agents = target.agents
    addrs: dict[str, str] = {}
    if "{addr}" in agents.host:
        try:
            records = parse_oneliner(commands(["scontrol", "--oneliner", "show", "node"]))
        except BackendError as exc:
            raise LabNotReady(f"agents.host {agents.host}: {exc}") from exc
        addrs = {
            r["NodeName"]: r.get("NodeAddr", r["NodeName"]) for r in records if "NodeName" in r
        }
    endpoints = tuple(
        _agent(agents, n, agents.host.format(node=n, addr=addrs.get(n, n))) for n in job.nodes
    )
    world_size = len(job.nodes) * target.slurm.nproc_per_node
    return _platform_target(
        target,
        run_dir,
        jobs=SlurmJobs(
            commands,
            job,
            log_dir=_log_dir(target, run_dir, job.name, job.job_id),
            world_size=world_size,
        ),
        world_size=world_size,
        agents=endpoints,
        placement=_slurm_backend(commands, target, run_dir),
    )


def _platform_target(
    target: TargetFile,
    run_dir: Path,
    *,
    jobs: SlurmJobs | KubernetesJobs,
    world_size: int,
    agents: tuple[AgentEndpoint, ...],
    placement: SlurmBackend | KubernetesBackend,
) -> Target:
    creds = target.credentials
    return Target(
        run_dir=Path(run_dir),
        jobs=jobs,
        world_size=world_size,
        prometheus_url=target.prometheus.url if target.prometheus is not None else None,
        agents=agents,
        agent_token_file=creds.agent_token_file,
        responder_url=creds.responder_url,
        responder_token_file=creds.responder_token_file,
        placement=placement,
        attach_job=jobs.attached,
    )


class KubernetesJobs:
    """The :class:`~stormwatch.chaos.target.JobControl` of a job's pods (attach only): it
    has ended when none of its pods is live any more."""

    def __init__(
        self, backend: KubernetesBackend, *, name: str, log_dir: Path, world_size: int
    ) -> None:
        self._backend = backend
        #: The job name the runner attaches to.
        self.attached = name
        self._log_dir = log_dir
        self._world_size = world_size

    def start(self, job: JobSection) -> JobRef:
        raise ChaosError(f"cannot start job {job.name!r} on kubernetes: attach with --job")

    def attach(self, name: str) -> JobRef:
        try:
            self._backend.ranks(name)
        except BackendError as exc:
            raise LabNotReady(str(exc)) from exc
        return JobRef(
            name=name, log_dir=self._log_dir, world_size=self._world_size, started_by_runner=False
        )

    def exited(self, name: str) -> bool | None:
        return None

    def ended(self, name: str) -> bool:
        try:
            return not self._backend.pods(name)
        except BackendError as exc:
            logger.warning("job %s: pods unknown: %s", name, exc)
            return False

    def stop(self, name: str) -> None:
        raise ChaosError(f"cannot stop job {name!r}: it was not started by stormwatch chaos")


def kubernetes_target(
    target: TargetFile, run_dir: Path, *, backend: KubernetesBackend | None = None
) -> Target:
    """The :class:`Target` of a ``kubernetes`` target file (module docstring).

    Raises:
        LabNotReady: no job pods or no agent pod, or an API call failed.
    """
    from stormwatch.platforms.kubernetes import KubernetesBackend, discover_agents

    kube = target.kubernetes
    if backend is None:
        try:
            backend = KubernetesBackend.connect(
                namespace=kube.namespace,
                diagnostics_dir=Path(run_dir) / "chaos" / "diagnostics",
                job_label=kube.job_label,
                control_dir=kube.control_dir,
                workload=kube.workload,
            )
        except BackendError as exc:
            raise LabNotReady(str(exc)) from exc
    attach = target.job.attach if target.job is not None else None
    if attach is None or attach.name is None:
        raise LabNotReady("kubernetes targets attach by job.attach.name (the job label's value)")
    agents = target.agents
    try:
        ranks = backend.ranks(attach.name)
        found = discover_agents(
            backend.api,
            namespace=agents.namespace or kube.namespace,
            selector=agents.selector or "",
        )
        pods = sorted((node, endpoint.ip) for node, endpoint in found.items())
    except BackendError as exc:
        raise LabNotReady(str(exc)) from exc
    if not pods:
        raise LabNotReady(f"agents.selector {agents.selector}: no Ready agent pod")
    return _platform_target(
        target,
        run_dir,
        jobs=KubernetesJobs(
            backend,
            name=attach.name,
            log_dir=_log_dir(target, run_dir, attach.name, ""),
            world_size=len(ranks),
        ),
        world_size=len(ranks),
        agents=tuple(_agent(agents, node, ip) for node, ip in pods),
        placement=backend,
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
    "KubernetesJobs",
    "SlurmJobs",
    "attach_slurm_job",
    "kubernetes_target",
    "resolve_target",
    "slurm_target",
    "target_from_file",
]
