"""The fault catalogue as the experiment file spells it: one strict pydantic model per kind.

Each model is what an experiment's ``fault:`` mapping holds (``kind`` picks
the model; unknown keys and wrong types are errors). Except ``freeze_rank``
(controller-side, kept for hosts without agents), every kind is applied by
the node agent of the target node through its fault API, which reverts it on
its own at ``ttl_seconds`` (see docs/faults.md for what each models in
production and the agent-side kinds in :mod:`stormwatch.agent.faults`).

Targeting (resolved by the controller to node agents):

* ``rank: R``: the node whose agent lists rank R of the job (rank faults);
* ``node: NAME``: that node (node faults; give ``node`` *or* ``rank``: the
  node holding the rank);
* ``partition``: ``nodes`` (side A) and ``peers`` (side B, default: every
  other node); rules go on side A's nodes.

This module imports nothing from the rest of the chaos package, so the
experiment model can import it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Longest fault time-to-live: one day. A fault that must outlive a day is a mistake.
MAX_TTL_SECONDS = 86_400.0

Signal = Literal["SIGKILL", "SIGTERM"]
_NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NODE = Field(default=None, pattern=_NODE_PATTERN)
_NodeName = Annotated[str, Field(pattern=_NODE_PATTERN)]
_RANK = Field(default=None, ge=0, le=65_535)
_TTL = Field(default=60.0, gt=0, le=MAX_TTL_SECONDS)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def agent_body(self) -> dict[str, object]:
        """The agent's request fields for this fault (without ``id`` and ``job``)."""
        return self.model_dump(mode="json", exclude={"node", "rank", "nodes", "peers"})


class _NodeOrRank(_Spec):
    """Fields of a node-level fault: ``node``, or ``rank`` (the node that holds it)."""

    node: str | None = _NODE
    rank: int | None = _RANK

    @model_validator(mode="after")
    def _one_target(self) -> _NodeOrRank:
        if (self.node is None) == (self.rank is None):
            raise ValueError("give exactly one of 'node' (a node name) or 'rank' (its node)")
        return self


# ------------------------------------------------------------------ process
class KillRankFault(_Spec):
    """Kill one rank's worker (a crashed process: segfault, OOM kill, ``kill -9``).

    The kill itself cannot be undone; torchrun is expected to restart the
    workers. ``ttl_seconds`` bounds the agent-side fault record.
    """

    kind: Literal["kill_rank"]
    rank: int = Field(ge=0, le=65_535)
    signal: Signal = "SIGKILL"
    ttl_seconds: float = Field(default=300.0, gt=0, le=MAX_TTL_SECONDS)


class FreezeRankFault(_Spec):
    """Freeze one rank's worker with SIGSTOP; revert sends SIGCONT (controller-side).

    The controller signals the process directly (the lab shares one PID
    namespace); a detached reaper reverts it when ``ttl_seconds`` expire, even
    if the controller died. Prefer ``freeze_ranks`` (agent-side) on a cluster.
    """

    kind: Literal["freeze_rank"]
    rank: int = Field(ge=0, le=65_535)
    ttl_seconds: float = Field(default=60.0, gt=0, le=MAX_TTL_SECONDS)


class FreezeRanksFault(_NodeOrRank):
    """Agent-side SIGSTOP of one rank (``rank``) or of every rank on a node (``node``): a
    hung process or host; SIGCONT at the TTL, by the agent, even if the controller died.
    ``include_torchrun`` also stops the node's torchrun agent (a whole hung host)."""

    kind: Literal["freeze_ranks"]
    include_torchrun: bool = False
    ttl_seconds: float = _TTL

    def agent_body(self) -> dict[str, object]:
        body = super().agent_body()
        body["ranks"] = None if self.rank is None else [self.rank]
        return body


class KillTorchrunFault(_NodeOrRank):
    """Kill the node's torchrun agent (the launcher dies; its workers lose their parent)."""

    kind: Literal["kill_torchrun"]
    signal: Signal = "SIGKILL"
    ttl_seconds: float = _TTL


class KillNodeProcessesFault(_NodeOrRank):
    """Kill every training process on a node (torchrun and all its workers): a node lost."""

    kind: Literal["kill_node_processes"]
    signal: Signal = "SIGKILL"
    ttl_seconds: float = _TTL


class KillRdzvHostFault(_Spec):
    """Kill the torchrun that hosts the job's rendezvous (c10d) store; the controller asks
    every agent, only the host's answers."""

    kind: Literal["kill_rdzv_host"]
    signal: Signal = "SIGKILL"
    ttl_seconds: float = _TTL


class KillAgentFault(_NodeOrRank):
    """Kill the node's stormwatch agent itself (monitoring blind spot: StormwatchAgentDown)."""

    kind: Literal["kill_agent"]
    signal: Signal = "SIGKILL"
    ttl_seconds: float = _TTL


# ------------------------------------------------------------------ network
class PartitionFault(_Spec):
    """Network partition between node sets (iptables DROP on side A's nodes).

    ``direction``: ``both`` (nothing passes), ``outbound`` (A -> B dropped, B -> A
    passes at IP level) or ``inbound`` (B -> A dropped). Revert checks that A
    can connect to each B agent's port again within ``verify_timeout_seconds``,
    and fails loudly otherwise (FC-13).
    """

    kind: Literal["partition"]
    nodes: list[_NodeName] = Field(min_length=1)
    peers: list[_NodeName] | None = None
    direction: Literal["both", "outbound", "inbound"] = "both"
    verify_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    ttl_seconds: float = _TTL

    @model_validator(mode="after")
    def _disjoint(self) -> PartitionFault:
        if self.peers is not None and set(self.peers) & set(self.nodes):
            raise ValueError("'nodes' and 'peers' must not share a node")
        return self


class IsolateStoreFault(_NodeOrRank):
    """Drop a node's traffic to the rendezvous store only (``store`` ``host:port``; default:
    the ``--rdzv-endpoint`` of the job's torchrun on that node)."""

    kind: Literal["isolate_store"]
    store: str | None = Field(default=None, pattern=r"^[^:\s]+:[0-9]{1,5}$")
    ttl_seconds: float = _TTL


class BandwidthLimitFault(_NodeOrRank):
    """Token-bucket rate limit (``tc tbf``) on the node's link: a degraded NIC or a
    congested uplink. ``rate_kbit``: kilobits per second."""

    kind: Literal["bandwidth_limit"]
    rate_kbit: int = Field(ge=8, le=100_000_000)
    burst_bytes: int = Field(default=32_768, ge=1_600, le=1 << 30)
    latency_ms: float = Field(default=50.0, gt=0, le=10_000)
    ttl_seconds: float = _TTL


class PacketDropFault(_NodeOrRank):
    """Random packet loss on the node (iptables ``statistic --mode random``), in and out,
    optionally only to/from ``peers`` (node names): a flaky cable or switch port."""

    kind: Literal["packet_drop"]
    probability: float = Field(gt=0, le=1)
    peers: list[_NodeName] | None = None
    ttl_seconds: float = _TTL


class LinkFlapFault(_NodeOrRank):
    """The node's link goes down for ``down_seconds`` every ``period_seconds`` (a flapping
    port); it is up again at the end."""

    kind: Literal["link_flap"]
    period_seconds: float = Field(default=4.0, gt=0, le=3600)
    down_seconds: float = Field(default=1.0, gt=0, le=3600)
    ttl_seconds: float = _TTL

    @model_validator(mode="after")
    def _down_within_period(self) -> LinkFlapFault:
        if self.down_seconds >= self.period_seconds:
            raise ValueError("down_seconds must be shorter than period_seconds")
        return self


# ----------------------------------------------------------------- slowdown
class CpuThrottleFault(_Spec):
    """Throttle one rank to ``cpu_fraction`` of one CPU (cgroup CPU quota, else a
    SIGSTOP/SIGCONT duty cycle): a noisy neighbour or a thermally limited host CPU."""

    kind: Literal["cpu_throttle"]
    rank: int = Field(ge=0, le=65_535)
    cpu_fraction: float = Field(gt=0, lt=64)
    method: Literal["auto", "cgroup", "duty_cycle"] = "auto"
    ttl_seconds: float = _TTL

    def agent_body(self) -> dict[str, object]:
        return {**super().agent_body(), "rank": self.rank}


class TrainerFaultFault(_Spec):
    """Arm one of the trainer's fault points on ``rank`` (its control channel): ``slow_step``
    (``seconds`` of extra compute per step), ``collective_delay`` (``seconds`` before each
    matching collective), ``collective_hang`` (blocks until the TTL), ``error_at_step``."""

    kind: Literal["trainer_fault"]
    rank: int = Field(ge=0, le=65_535)
    point: Literal["slow_step", "collective_delay", "collective_hang", "error_at_step"]
    seconds: float | None = Field(default=None, gt=0, le=3600)
    op: str | None = Field(default=None, min_length=1)
    mesh_dim: str | None = Field(default=None, min_length=1)
    step: int | None = Field(default=None, ge=1)
    ttl_seconds: float = _TTL

    @model_validator(mode="after")
    def _fields_of_point(self) -> TrainerFaultFault:
        needs_seconds = self.point in ("slow_step", "collective_delay")
        if needs_seconds != (self.seconds is not None):
            raise ValueError(
                f"'seconds' is {'required' if needs_seconds else 'not used'} for {self.point}"
            )
        if (self.point == "error_at_step") != (self.step is not None):
            raise ValueError("'step' is required for error_at_step and only for it")
        if self.point not in ("collective_delay", "collective_hang") and (self.op or self.mesh_dim):
            raise ValueError("'op' and 'mesh_dim' apply to collective_delay/collective_hang only")
        return self

    def agent_body(self) -> dict[str, object]:
        body = super().agent_body()
        body["rank"] = self.rank
        return {k: v for k, v in body.items() if v is not None}


# ---------------------------------------------------------------------- GPU
class GpuXidFault(_NodeOrRank):
    """Simulated GPU: report XID ``xid`` on GPU ``gpu`` (79 fallen off the bus, 48 double-bit
    ECC, 94/95 contained/uncontained ECC; 48/94/95 also count a DBE; 79 also loses the GPU
    until the TTL)."""

    kind: Literal["gpu_xid"]
    gpu: int = Field(default=0, ge=0, le=63)
    xid: int = Field(ge=1, le=999)
    ttl_seconds: float = _TTL


class GpuThrottleFault(_NodeOrRank):
    """Simulated GPU: clocks throttled for ``reason`` (``thermal``: HW + SW thermal
    slowdown bits; ``power``: SW power cap + HW power brake)."""

    kind: Literal["gpu_throttle"]
    gpu: int = Field(default=0, ge=0, le=63)
    reason: Literal["thermal", "power"]
    ttl_seconds: float = _TTL


class NvlinkDownFault(_NodeOrRank):
    """Simulated GPU: NVLink ``links`` (default all) of ``gpu`` inactive."""

    kind: Literal["nvlink_down"]
    gpu: int = Field(default=0, ge=0, le=63)
    links: list[Annotated[int, Field(ge=0, le=63)]] | None = None
    ttl_seconds: float = _TTL


class NvlinkErrorsFault(_NodeOrRank):
    """Simulated GPU: a burst of ``count`` NVLink ``counter`` errors on ``link`` of ``gpu``."""

    kind: Literal["nvlink_errors"]
    gpu: int = Field(default=0, ge=0, le=63)
    link: int = Field(default=0, ge=0, le=63)
    counter: Literal["crc_flit", "crc_data", "replay", "recovery"] = "crc_flit"
    count: int = Field(default=1000, ge=1, le=1 << 40)
    ttl_seconds: float = _TTL


class GpuLostFault(_NodeOrRank):
    """Simulated GPU: ``gpu`` falls off the bus (every NVML call: GPU_IS_LOST) until the TTL."""

    kind: Literal["gpu_lost"]
    gpu: int = Field(default=0, ge=0, le=63)
    ttl_seconds: float = _TTL


class GpuPowerCapFault(_NodeOrRank):
    """NVML (real or simulated): cap ``gpu``'s power limit to ``watts`` (and/or lock clocks
    to at most ``max_clock_mhz``); the previous values are restored at the TTL."""

    kind: Literal["gpu_power_cap"]
    gpu: int = Field(default=0, ge=0, le=63)
    watts: float | None = Field(default=None, gt=0, le=5000)
    max_clock_mhz: int | None = Field(default=None, gt=0, le=10_000)
    ttl_seconds: float = _TTL

    @model_validator(mode="after")
    def _something(self) -> GpuPowerCapFault:
        if self.watts is None and self.max_clock_mhz is None:
            raise ValueError("give 'watts', 'max_clock_mhz' or both")
        return self


# ------------------------------------------------------------------ storage
class CheckpointReadOnlyFault(_NodeOrRank):
    """The checkpoint folder becomes read-only (EROFS) on the node: a remounted volume.
    ``path`` default: the job's ``--checkpoint-dir`` seen on the node's ranks."""

    kind: Literal["checkpoint_readonly"]
    path: str | None = Field(default=None, pattern=r"^/")
    ttl_seconds: float = _TTL


class CheckpointFullFault(_NodeOrRank):
    """The checkpoint folder is full (ENOSPC) on the node; existing files stay readable and
    nothing is ever deleted. ``path`` as for ``checkpoint_readonly``."""

    kind: Literal["checkpoint_full"]
    path: str | None = Field(default=None, pattern=r"^/")
    ttl_seconds: float = _TTL


Fault = Annotated[
    KillRankFault
    | FreezeRankFault
    | FreezeRanksFault
    | KillTorchrunFault
    | KillNodeProcessesFault
    | KillRdzvHostFault
    | KillAgentFault
    | PartitionFault
    | IsolateStoreFault
    | BandwidthLimitFault
    | PacketDropFault
    | LinkFlapFault
    | CpuThrottleFault
    | TrainerFaultFault
    | GpuXidFault
    | GpuThrottleFault
    | NvlinkDownFault
    | NvlinkErrorsFault
    | GpuLostFault
    | GpuPowerCapFault
    | CheckpointReadOnlyFault
    | CheckpointFullFault,
    Field(discriminator="kind"),
]

#: Kinds whose effect is final (a kill): nothing to undo, revert only closes the record.
FINAL_KINDS = frozenset(
    {"kill_rank", "kill_torchrun", "kill_node_processes", "kill_rdzv_host", "kill_agent"}
)


def target_rank(fault: object) -> int | None:
    """The rank a fault names (rank faults, or node faults given by rank); None otherwise."""
    rank = getattr(fault, "rank", None)
    return rank if isinstance(rank, int) else None


def target_nodes(fault: object) -> list[str]:
    """The node names a fault names explicitly (``node``, or ``nodes`` of a partition)."""
    if isinstance(fault, PartitionFault):
        return list(fault.nodes)
    node = getattr(fault, "node", None)
    return [node] if isinstance(node, str) else []


__all__ = [
    "FINAL_KINDS",
    "MAX_TTL_SECONDS",
    "BandwidthLimitFault",
    "CheckpointFullFault",
    "CheckpointReadOnlyFault",
    "CpuThrottleFault",
    "Fault",
    "FreezeRankFault",
    "FreezeRanksFault",
    "GpuLostFault",
    "GpuPowerCapFault",
    "GpuThrottleFault",
    "GpuXidFault",
    "IsolateStoreFault",
    "KillAgentFault",
    "KillNodeProcessesFault",
    "KillRankFault",
    "KillRdzvHostFault",
    "KillTorchrunFault",
    "LinkFlapFault",
    "NvlinkDownFault",
    "NvlinkErrorsFault",
    "PacketDropFault",
    "PartitionFault",
    "TrainerFaultFault",
    "target_nodes",
    "target_rank",
]
