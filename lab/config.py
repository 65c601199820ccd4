"""Validated, frozen settings of the lab (:class:`LabConfig`) and of one job (:class:`JobSpec`).

Both are pydantic models that reject unknown fields and raise
:class:`stormwatch.errors.ConfigError` (not pydantic's ``ValidationError``) with a
message naming the field and what is allowed. Names and addresses of everything
the lab creates are derived here, in one place, so that ``lab down`` can find
them again from the configuration alone.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stormwatch.errors import ConfigError
from stormwatch.platforms.stopping import GracePeriod
from stormwatch.trainer.config import SEED_LIMIT

#: Host offset of node 0 inside the subnet (10.213.0.10); node i gets offset + i.
NODE_HOST_OFFSET = 10
#: Nodes of a lab job unless it says otherwise: the default lab's third node is a spare.
DEFAULT_JOB_NODES = 2
#: Name of the node's interface inside its namespace (what GLOO_SOCKET_IFNAME names).
NODE_INTERFACE = "eth0"

_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def describe_validation_error(model: str, exc: ValidationError) -> str:
    """One line per problem: ``Model.field: message (got value)``."""
    lines = []
    for err in exc.errors():
        where = "".join(f".{part}" for part in err["loc"])
        shown = where and err.get("type") != "missing" and "input" in err
        got = f" (got {err['input']!r})" if shown else ""
        message = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{model}{where}: {message}{got}")
    return "; ".join(lines)


class _Frozen(BaseModel):
    """Frozen model whose construction errors are :class:`ConfigError`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(type(self).__name__, exc)) from exc


class LabConfig(_Frozen):
    """Shape, names, addresses and ports of one lab.

    Defaults are the lab of docs/ARCHITECTURE.md: three nodes (a two-node job and a spare
    node, issue 15) with two ranks each on 10.213.0.0/24, named ``sw-node0`` ..
    ``sw-node2`` behind bridge ``swbr0``, a Slurm cluster over them. Tests
    and a second lab on the same machine change ``prefix``, ``subnet`` and the
    root-namespace ports so that they cannot collide.

    Attributes:
        nodes: number of nodes (network namespaces), 1..8 (3: a job of
            :data:`DEFAULT_JOB_NODES` nodes and a spare one for exclude-and-restart).
        nproc_per_node: torchrun workers per node (the TP degree of a job), 1..8.
        subnet: IPv4 subnet of the bridge; the bridge gets host 1, node i host 10 + i.
        prefix: prefix of every kernel object name (bridge ``<prefix>br0``, namespaces
            ``<prefix>-node<i>``, host-side veths ``<prefix>v<i>``); lowercase, <= 8
            characters so that interface names fit Linux's 15-character limit.
        prometheus_port / alertmanager_port / responder_port: loopback ports in the
            root namespace.
        agent_port: the agents' read-only port (``/metrics``, ``/healthz``) inside each
            namespace.
        agent_fault_port: the agents' fault API port (``--fault-api-listen``) inside
            each namespace; the chaos controller sends faults there.
        rdzv_port: torchrun's c10d rendezvous port on node 0.
        startup_timeout: seconds to wait for every service to become healthy (60 s:
            Prometheus replays its WAL on a reused run directory).
        scrape_interval: Prometheus scrape and rule evaluation interval, seconds (1 s so
            that chaos experiments see effects within seconds).
        alert_group_wait: Alertmanager ``group_wait``, seconds (upstream default 30 s; 1 s
            so that a chaos experiment's alert reaches the responder at once).
        alert_group_interval: Alertmanager ``group_interval``, seconds (also delays
            "resolved" notifications; upstream default 5 min).
        sim_gpus: simulated GPUs per agent; ``None`` means ``nproc_per_node``.
        slurm: start a Slurm cluster over the nodes (munged and slurmctld in the root
            namespace, one slurmd per node namespace; :mod:`stormwatch.lab.slurm`).
        slurmctld_port: slurmctld's port on every root-namespace address (Slurm's
            default 6817 + 10000, so that a site slurmctld on the machine is not in the
            way; a second lab needs another).
        scheduler: how jobs start: ``slurm`` (``sbatch`` of deploy/slurm/train.sbatch,
            :mod:`stormwatch.lab.jobs.slurmjob`; needs ``slurm``) or ``direct`` (one torchrun
            per node started by the lab); ``None``: ``slurm`` when the lab runs Slurm
            (:attr:`job_scheduler`). Elastic jobs and jobs with an ``entrypoint`` always
            start directly.
        grace_period_s: seconds every stop of the lab's processes gives them between
            SIGTERM and SIGKILL before confirming them gone (:mod:`stormwatch.platforms.
            stopping`): the responder's restarts (written to the lab's target file), ``lab
            stop``, a chaos run stopping its job, and the Slurm cluster's ``KillWait``. 5 s:
            torchrun and the trainer stop in well under that; Slurm's default 30 s would
            hold every restart and ``lab down``.
    """

    nodes: int = Field(default=3, ge=1, le=8)
    nproc_per_node: int = Field(default=2, ge=1, le=8)
    subnet: ipaddress.IPv4Network = ipaddress.IPv4Network("10.213.0.0/24")
    prefix: str = "sw"
    prometheus_port: int = Field(default=19090, ge=1, le=65535)
    alertmanager_port: int = Field(default=19093, ge=1, le=65535)
    responder_port: int = Field(default=19095, ge=1, le=65535)
    agent_port: int = Field(default=9400, ge=1, le=65535)
    agent_fault_port: int = Field(default=9401, ge=1, le=65535)
    rdzv_port: int = Field(default=29400, ge=1, le=65535)
    startup_timeout: float = Field(default=60.0, gt=0, le=3600)
    scrape_interval: float = Field(default=1.0, gt=0, le=60)
    alert_group_wait: float = Field(default=1.0, gt=0, le=600)
    alert_group_interval: float = Field(default=5.0, gt=0, le=3600)
    sim_gpus: int | None = Field(default=None, ge=0, le=16)
    slurm: bool = True
    slurmctld_port: int = Field(default=16817, ge=1, le=65535)
    scheduler: Literal["slurm", "direct"] | None = None
    grace_period_s: GracePeriod = 5

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", value):
            raise ValueError(
                "must be 1-8 lowercase letters/digits starting with a letter "
                "(interface names are limited to 15 characters)"
            )
        return value

    @model_validator(mode="after")
    def _check_layout(self) -> LabConfig:
        needed = NODE_HOST_OFFSET + self.nodes + 1
        if self.subnet.num_addresses < needed:
            raise ValueError(
                f"subnet {self.subnet} is too small for {self.nodes} nodes "
                f"(needs {needed} addresses; use a /24 or a /27 at least)"
            )
        ports = {
            "prometheus_port": self.prometheus_port,
            "alertmanager_port": self.alertmanager_port,
            "responder_port": self.responder_port,
        }
        if self.slurm:
            ports["slurmctld_port"] = self.slurmctld_port
        if self.scheduler == "slurm" and not self.slurm:
            raise ValueError(
                "scheduler 'slurm' needs slurm=True (the lab's Slurm cluster); "
                "pass --scheduler direct with --no-slurm"
            )
        if len(set(ports.values())) != len(ports):
            raise ValueError(f"root-namespace ports must differ (got {ports})")
        node_ports = {
            "agent_port": self.agent_port,
            "agent_fault_port": self.agent_fault_port,
            "rdzv_port": self.rdzv_port,
        }
        if len(set(node_ports.values())) != len(node_ports):
            raise ValueError(f"ports inside a node must differ (got {node_ports})")
        return self

    # -- derived names and addresses ---------------------------------------------------
    @property
    def bridge(self) -> str:
        """Name of the bridge in the root namespace (``swbr0``)."""
        return f"{self.prefix}br0"

    @property
    def bridge_interface(self) -> ipaddress.IPv4Interface:
        """Address of the bridge with prefix length (``10.213.0.1/24``)."""
        return ipaddress.IPv4Interface(f"{self.subnet[1]}/{self.subnet.prefixlen}")

    @property
    def job_scheduler(self) -> Literal["slurm", "direct"]:
        """How jobs start: :attr:`scheduler`, else ``slurm`` with :attr:`slurm` on."""
        if self.scheduler is not None:
            return self.scheduler
        return "slurm" if self.slurm else "direct"

    @property
    def job_nodes(self) -> int:
        """Nodes of a job that does not say (:data:`DEFAULT_JOB_NODES`, or every node of a
        smaller lab)."""
        return min(DEFAULT_JOB_NODES, self.nodes)

    @property
    def world_size(self) -> int:
        """Ranks of a job on :attr:`job_nodes` nodes (4 in the default lab)."""
        return self.job_nodes * self.nproc_per_node

    def node_name(self, index: int) -> str:
        """Logical node name (``node0``), used as the agent's ``--node`` and Prometheus label."""
        return f"node{index}"

    def netns(self, index: int) -> str:
        """Network namespace of node ``index`` (``sw-node0``)."""
        return f"{self.prefix}-node{index}"

    def veth(self, index: int) -> str:
        """Host-side end of node ``index``'s veth pair (``swv0``); the other end is ``eth0``."""
        return f"{self.prefix}v{index}"

    def node_address(self, index: int) -> ipaddress.IPv4Address:
        """Address of node ``index`` (``10.213.0.10`` + index)."""
        return self.subnet[NODE_HOST_OFFSET + index]

    def owns_link(self, name: str) -> bool:
        """Whether a root-namespace link name is one this configuration creates."""
        return name == self.bridge or re.fullmatch(rf"{self.prefix}v\d+", name) is not None

    def owns_netns(self, name: str) -> bool:
        """Whether a namespace name is one this configuration creates."""
        return re.fullmatch(rf"{self.prefix}-node\d+", name) is not None


class JobSpec(_Frozen):
    """One training job on the first ``nodes`` nodes of the lab.

    The job runs ``stormwatch train`` under one torchrun per node (dp = nodes,
    tp = ``nproc_per_node``), unless ``command`` (a user's own training program) or
    ``entrypoint`` (a smoke test's stand-in) replaces the trainer.

    Attributes:
        name: job name; also the torchrun rendezvous id, the Slurm job name and the
            folder under ``jobs/``.
        nodes: nodes the job runs on; ``None``: :attr:`LabConfig.job_nodes` (2, or every
            node of a smaller lab). More than the lab has is refused when it starts.
        steps: optimizer steps to train.
        checkpoint_every: steps between checkpoints (0: never).
        seed: random seed passed to the trainer, in [0, 2**63) (the trainer's range,
            :data:`~stormwatch.trainer.config.SEED_LIMIT`).
        step_delay: extra seconds each step sleeps (slows a job down for chaos tests).
        max_restarts: torchrun ``--max-restarts`` (worker-group restarts before failing).
        env: extra environment for the workers (added after the lab's own variables).
        extra_args: extra arguments appended to the trainer's command line.
        command: the job's own training program (an executable and its arguments, e.g.
            ``("python", "train.py", "--max-steps", "50")``), run by torchrun (with
            ``--no-python``) on every node in place of ``stormwatch train``, and
            launched as the trainer is (through Slurm's recipe on the Slurm lab, so the
            responder's Slurm actions apply to it). It gets no trainer options
            (``steps``, ``checkpoint_every``, ``seed``, ``step_delay`` and
            ``extra_args`` are the trainer's; the command carries its own) and finds its
            folders in the environment, as the telemetry API reads them:
            ``STORMWATCH_LOG_DIR`` (the job's ``logs``), ``STORMWATCH_DUMP_DIR``
            (``logs/dumps``), ``STORMWATCH_CHECKPOINT_DIR`` (``checkpoints``), besides
            every job's ``STORMWATCH_JOB``, ``STORMWATCH_METRICS_DIR`` and
            ``STORMWATCH_CONTROL_DIR``. Not with ``entrypoint``; not elastic (``min_nodes``).
        entrypoint: replaces ``stormwatch train ...`` with this command (an executable
            and its arguments; run by torchrun with ``--no-python``), for smoke tests:
            always launched directly by the lab (never through Slurm), ``extra_args``
            appended, no folders in its environment.
        min_nodes: makes the job elastic: torchrun ``--nnodes MIN_NODES:NODES`` (its own
            ``nodes``) and the
            trainer's dp follows the nodes present (``--dp auto``); ``None``: fixed size.
            A lost node shrinks the job to the survivors (one restart, resumed from
            the last checkpoint); a node started again (:meth:`Lab.rejoin_job_node`)
            grows it back. See :mod:`stormwatch.lab.jobs.elastic`.
        global_batch: the trainer's ``--global-batch`` (sequences per optimizer step,
            kept constant when an elastic job resizes); ``None``: for an elastic job the
            smallest that every possible dp divides, otherwise the trainer's default.
    """

    name: str
    nodes: int | None = Field(default=None, ge=1, le=8)
    steps: int = Field(default=60, ge=1)
    checkpoint_every: int = Field(default=10, ge=0)
    seed: int = Field(default=0, ge=0, lt=SEED_LIMIT)
    step_delay: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    max_restarts: int = Field(default=3, ge=0, le=100)
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    min_nodes: int | None = Field(default=None, ge=1, le=8)
    global_batch: int | None = Field(default=None, ge=1)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _JOB_NAME.fullmatch(value):
            raise ValueError(
                "must be 1-63 characters of letters, digits, '_', '.', '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("command", "entrypoint")
    @classmethod
    def _check_entrypoint(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value:
            raise ValueError("must name an executable when given")
        return value

    @model_validator(mode="after")
    def _command_alone(self) -> JobSpec:
        if self.command is not None and self.entrypoint is not None:
            raise ValueError(
                "command and entrypoint both replace the trainer: give one (command for a "
                "training program, entrypoint for a smoke test's stand-in)"
            )
        if self.command is not None and self.min_nodes is not None:
            raise ValueError(
                "min_nodes: an elastic job runs the trainer (--dp auto, a fixed global "
                "batch); remove min_nodes to run a command"
            )
        if self.command is not None and self.extra_args:
            raise ValueError("extra_args are trainer options; put the arguments in command instead")
        return self

    def node_count(self, lab: LabConfig) -> int:
        """Nodes of this job in ``lab`` (:attr:`nodes`, default :attr:`LabConfig.job_nodes`)."""
        return lab.job_nodes if self.nodes is None else self.nodes


__all__ = [
    "DEFAULT_JOB_NODES",
    "NODE_HOST_OFFSET",
    "NODE_INTERFACE",
    "JobSpec",
    "LabConfig",
    "describe_validation_error",
]
