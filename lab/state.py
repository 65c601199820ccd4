"""The lab's state file, ``<run-dir>/lab.json`` (:class:`LabState`), and its store.

``lab up`` writes the file before it creates anything and records every kernel
object and process *as it creates it*, so that ``lab down`` in a fresh process
(even after ``lab up`` was SIGKILLed) knows what to remove. Readers (chaos,
demo, the responder and incident post-mortems) get the URLs, token files and node
addresses from it, always through :class:`LabState` (:func:`load_lab_state`).

Writes are atomic (temporary file + rename) and serialised with ``flock`` on
``<run-dir>/.lab.lock``, so ``lab train`` and ``lab down`` in two processes do
not lose each other's updates.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from stormwatch.lab.config import JobSpec, LabConfig, describe_validation_error
from stormwatch.lab.errors import JobError, LabError, LabNotUpError
from stormwatch.lab.paths import RunPaths

Phase = Literal["starting", "up", "failed", "stopping", "down"]


class ProcessRecord(BaseModel):
    """One long-running process started by the lab, behind its supervisor.

    A pid only counts as this process while its start time matches
    ``create_time`` (psutil's, seconds since the epoch): a recycled pid is never
    signalled.

    Attributes:
        name: service or job-node name (``prometheus``, ``agent-node0``, ``baseline/node1``).
        pid / create_time: the command itself (e.g. torchrun).
        supervisor_pid / supervisor_create_time: the supervisor that reaps it and
            records its exit status in ``status_file``.
        cmd: the command line.
        netns: the network namespace it runs in (``None``: the root namespace).
    """

    name: str
    pid: int
    create_time: float
    supervisor_pid: int
    supervisor_create_time: float
    cmd: list[str]
    log_file: Path
    status_file: Path
    netns: str | None = None
    started_at: float


class NetResource(BaseModel):
    """A kernel object (or file) the lab created and ``lab down`` removes."""

    kind: Literal["bridge", "veth", "netns"]
    name: str


class NodeState(BaseModel):
    """One node of the lab.

    Attributes:
        name: logical name (``node0``); the agent's ``--node`` and the ``node`` label.
        netns: its network namespace (``sw-node0``).
        address: its address on the lab bridge (``10.213.0.10``).
        interface: its interface inside the namespace (``eth0``, the GLOO_SOCKET_IFNAME).
        veth: the host-side end of its veth pair.
        agent_url: base URL of its agent (``http://10.213.0.10:9400``), reachable from the
            root namespace.
        agent_fault_url: base URL of its agent's fault API listener
            (``http://10.213.0.10:9401``); None in state files written before the fault
            API had its own listener.
        metrics_dir: its prometheus-client multiprocess directory.
    """

    name: str
    netns: str
    address: ipaddress.IPv4Address
    interface: str
    veth: str
    agent_url: str
    agent_fault_url: str | None = None
    metrics_dir: Path


class SlurmState(BaseModel):
    """The lab's Slurm cluster (:mod:`stormwatch.lab.slurm`), as ``lab up`` started it.

    Attributes:
        conf: its ``slurm.conf`` (what ``SLURM_CONF`` must name for ``sinfo``,
            ``sbatch`` ... to reach it).
        controller_address / controller_port: where slurmctld listens (the bridge).
        partition: the one partition, holding every node.
        nodes: Slurm node names, in lab order (the lab's node names).
        ready_after_s: seconds from the first daemon's start to every node idle.
    """

    conf: Path
    controller_address: ipaddress.IPv4Address
    controller_port: int
    partition: str
    nodes: list[str]
    ready_after_s: float | None = None

    def describe(self) -> str:
        """One line: controller, nodes, and the ``SLURM_CONF`` to use."""
        return (
            f"slurmctld {self.controller_address}:{self.controller_port}, partition "
            f"{self.partition} ({', '.join(self.nodes)}); SLURM_CONF={self.conf}"
        )


class JobInfo(BaseModel):
    """A job the lab started (returned by :meth:`Lab.start_job`).

    Attributes:
        node_pids: node name -> pid of that node's torchrun (the elastic agent).
        node_logs: node name -> torchrun's output (``<node>.torchrun.log``).
        started_at: Unix time, seconds.
        rdzv_port: the c10d rendezvous port on node 0, allocated per job (``None`` in
            state files written before it was recorded: ``LabConfig.rdzv_port``).
        relaunches: times every node was started again under a fresh rendezvous id
            after a ``RendezvousClosedError`` (FC-09, ``jobs.relaunch_closed``).
        slurm_job_id / slurm_conf: the Slurm job and the ``slurm.conf`` of the cluster it
            was submitted to, for a job started through Slurm
            (:mod:`stormwatch.lab.jobs.slurmjob`); ``None`` for one started directly.
    """

    name: str
    spec: JobSpec
    job_dir: Path
    log_dir: Path
    checkpoint_dir: Path
    node_pids: dict[str, int]
    node_logs: dict[str, Path]
    started_at: float
    rdzv_port: int | None = None
    relaunches: int = 0
    slurm_job_id: str | None = None
    slurm_conf: Path | None = None

    @classmethod
    def new(
        cls,
        paths: RunPaths,
        spec: JobSpec,
        rdzv_port: int,
        *,
        slurm_job_id: str | None = None,
        slurm_conf: Path | None = None,
    ) -> JobInfo:
        """A job about to start now, its folders under ``paths`` (no node yet)."""
        return cls(
            name=spec.name,
            spec=spec,
            job_dir=paths.job_dir(spec.name),
            log_dir=paths.job_logs(spec.name),
            checkpoint_dir=paths.job_checkpoints(spec.name),
            node_pids={},
            node_logs={},
            started_at=time.time(),
            rdzv_port=rdzv_port,
            slurm_job_id=slurm_job_id,
            slurm_conf=slurm_conf,
        )


class JobResult(BaseModel):
    """How a job ended.

    Attributes:
        ok: every node's torchrun exited with 0.
        exit_codes: node -> torchrun's exit status (negative: killed by that signal;
            ``None``: unknown, its supervisor was killed too).
        detail: when a node failed: which, and the last meaningful lines (errors,
            exceptions) of its torchrun log; ``None`` otherwise.
    """

    name: str
    ok: bool
    exit_codes: dict[str, int | None]
    detail: str | None = None


class JobRecord(BaseModel):
    """A job in the state file: what :class:`JobInfo` says plus its processes."""

    info: JobInfo
    processes: dict[str, ProcessRecord] = Field(default_factory=dict)
    stopped: bool = False


class LabState(BaseModel):
    """Contents of ``<run-dir>/lab.json``.

    Attributes:
        phase: ``starting`` (``lab up`` running or killed), ``up``, ``failed``
            (``lab up`` failed and cleaned up), ``stopping``, ``down``.
        nodes: the nodes, in order (node0 is the rendezvous host).
        prometheus_url / alertmanager_url / responder_url: base URLs (root namespace).
        agent_token_file / responder_token_file: bearer tokens (0600).
        resources: kernel objects created, in creation order.
        processes: service name -> process (``agent-node0``, ``prometheus``,
            ``alertmanager``, ``responder``).
        jobs: job name -> job.
        slurm: the Slurm cluster over the nodes (``None``: none, ``LabConfig.slurm`` off,
            or a state file written before the lab ran Slurm).
        error: why ``lab up`` failed, when it did.
    """

    version: Literal[1] = 1
    run_dir: Path
    config: LabConfig
    phase: Phase = "starting"
    created_at: float = Field(default_factory=time.time)
    bridge: str
    bridge_address: ipaddress.IPv4Interface
    nodes: list[NodeState]
    prometheus_url: str
    alertmanager_url: str
    responder_url: str
    agent_token_file: Path
    responder_token_file: Path
    resources: list[NetResource] = Field(default_factory=list)
    processes: dict[str, ProcessRecord] = Field(default_factory=dict)
    jobs: dict[str, JobRecord] = Field(default_factory=dict)
    slurm: SlurmState | None = None
    error: str | None = None

    def node(self, name: str) -> NodeState:
        """The node called ``name``; raises :class:`LabError` naming the known nodes."""
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise LabError(f"no node {name!r} in this lab (nodes: {known})")

    def job(self, name: str) -> JobRecord:
        """The job called ``name``; raises :class:`JobError` naming the known jobs."""
        try:
            return self.jobs[name]
        except KeyError:
            known = ", ".join(sorted(self.jobs)) or "none"
            raise JobError(f"no job {name!r} in this lab (jobs: {known})") from None


def plan_state(paths: RunPaths, config: LabConfig) -> LabState:
    """The state of a lab that is about to be created from ``config``."""
    nodes = [
        NodeState(
            name=config.node_name(i),
            netns=config.netns(i),
            address=config.node_address(i),
            interface="eth0",
            veth=config.veth(i),
            agent_url=f"http://{config.node_address(i)}:{config.agent_port}",
            agent_fault_url=f"http://{config.node_address(i)}:{config.agent_fault_port}",
            metrics_dir=paths.node_metrics(config.node_name(i)),
        )
        for i in range(config.nodes)
    ]
    return LabState(
        run_dir=paths.run_dir,
        config=config,
        bridge=config.bridge,
        bridge_address=config.bridge_interface,
        nodes=nodes,
        prometheus_url=f"http://127.0.0.1:{config.prometheus_port}",
        alertmanager_url=f"http://127.0.0.1:{config.alertmanager_port}",
        responder_url=f"http://127.0.0.1:{config.responder_port}",
        agent_token_file=paths.agent_token,
        responder_token_file=paths.responder_token,
    )


class StateStore:
    """Reads and atomically rewrites ``lab.json`` under an exclusive file lock."""

    def __init__(self, paths: RunPaths) -> None:
        self._paths = paths

    @property
    def path(self) -> Path:
        return self._paths.state_file

    @property
    def run_dir(self) -> Path:
        return self._paths.run_dir

    def load(self) -> LabState | None:
        """The state, or ``None`` when there is no file; :class:`LabError` when it is corrupt."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:  # a folder, a symlink loop, not UTF-8
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise LabError(
                f"{self.path}: cannot read the lab state file: {reason}; if no lab runs in "
                f"{self._paths.run_dir}, move it away and `stormwatch lab up` again"
            ) from exc
        try:
            return LabState.model_validate_json(text)
        except ValidationError as exc:
            detail = describe_validation_error("LabState", exc)
            raise LabError(f"{self.path}: not a lab state file: {detail}") from exc

    def require(self) -> LabState:
        """The state; :class:`LabNotUpError` when there is none."""
        state = self.load()
        if state is None:
            raise LabNotUpError(
                f"no lab in {self._paths.run_dir} (no lab.json); start one with `stormwatch lab up`"
            )
        return state

    def save(self, state: LabState) -> None:
        """Write ``state`` atomically (readers see the old or the new file, never half)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as fh:
            fh.write(state.model_dump_json(indent=2))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run directory's exclusive lock."""
        self._paths.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self._paths.lock_file, "a") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[LabState]:
        """Lock, load, let the caller change the state, save (unless the block raised).

        Raises:
            LabNotUpError: no lab; nothing is left behind (neither a missing run directory
                nor, in one without a lab, the lock file).
        """
        self.require()  # checked again under the lock: this one leaves no lock file behind
        with self.locked():
            state = self.require()
            yield state
            self.save(state)


def load_lab_state(run_dir: Path) -> LabState | None:
    """``<run_dir>/lab.json`` as :class:`LabState`, for readers outside the lab (no lock taken:
    the writer replaces the file atomically); ``None`` when there is none.

    Raises:
        LabError: the file exists but cannot be read or is not a lab state file.
    """
    return StateStore(RunPaths.of(run_dir)).load()


__all__ = [
    "JobInfo",
    "JobRecord",
    "JobResult",
    "LabState",
    "NetResource",
    "NodeState",
    "Phase",
    "ProcessRecord",
    "SlurmState",
    "StateStore",
    "load_lab_state",
    "plan_state",
]
