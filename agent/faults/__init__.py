"""Node-local faults the agent applies on request, each with a TTL and a durable ledger.

One module per family, registered in :data:`FAULT_TYPES` (catalogue: docs/faults.md):
``kill_rank.py``; ``processes.py`` (kill torchrun / node / rendezvous host / agent,
freeze ranks); ``network.py`` (iptables: partition, store isolation, packet drop);
``link.py`` (tbf rate limit, link flapping); ``slowdown.py`` (CPU throttle, trainer
fault points); ``gpu.py`` (simulated XIDs, throttling, NVLink, GPU lost; NVML power
caps); ``storage.py`` (checkpoint folder read-only or full). See :mod:`.base` for the
contract a kind implements.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pydantic import ValidationError

from stormwatch.agent.errors import InvalidFaultRequest
from stormwatch.agent.faults.base import Fault, FaultContext, FaultSpec, Injection
from stormwatch.agent.faults.gpu import (
    GpuLost,
    GpuPowerCap,
    GpuThrottle,
    GpuXid,
    NvlinkDown,
    NvlinkErrors,
)
from stormwatch.agent.faults.kill_rank import KillRank, KillRankSpec
from stormwatch.agent.faults.ledger import FaultLedger, FaultRecord, FaultState
from stormwatch.agent.faults.link import BandwidthLimit, LinkFlap
from stormwatch.agent.faults.manager import FaultManager
from stormwatch.agent.faults.network import IsolateStore, PacketDrop, Partition
from stormwatch.agent.faults.processes import (
    FreezeRanks,
    KillAgent,
    KillNodeProcesses,
    KillRdzvHost,
    KillTorchrun,
)
from stormwatch.agent.faults.slowdown import CpuThrottle, TrainerFault
from stormwatch.agent.faults.storage import CheckpointFull, CheckpointReadOnly

#: kind -> fault class. Add a kind here after writing its module.
FAULT_TYPES: Mapping[str, type[Fault]] = MappingProxyType(
    {
        kind.kind: kind
        for kind in (
            KillRank,
            KillTorchrun,
            KillNodeProcesses,
            KillRdzvHost,
            KillAgent,
            FreezeRanks,
            Partition,
            IsolateStore,
            PacketDrop,
            BandwidthLimit,
            LinkFlap,
            CpuThrottle,
            TrainerFault,
            GpuXid,
            GpuThrottle,
            NvlinkDown,
            NvlinkErrors,
            GpuLost,
            GpuPowerCap,
            CheckpointReadOnly,
            CheckpointFull,
        )
    }
)


def parse_fault_request(body: object) -> FaultSpec:
    """Validate a fault request body (parsed JSON) into its kind's spec.

    Raises:
        InvalidFaultRequest: not an object, unknown ``kind``, or invalid fields;
            ``problems`` names each field.
    """
    if not isinstance(body, dict):
        raise InvalidFaultRequest([("body", "must be a JSON object")])
    kind = body.get("kind")
    fault_type = FAULT_TYPES.get(kind) if isinstance(kind, str) else None
    if fault_type is None:
        raise InvalidFaultRequest(
            [("kind", f"must be one of {sorted(FAULT_TYPES)} (got {kind!r})")]
        )
    try:
        return fault_type.spec_type.model_validate(body)
    except ValidationError as exc:
        raise InvalidFaultRequest(
            [(".".join(str(p) for p in err["loc"]) or "body", err["msg"]) for err in exc.errors()]
        ) from exc


__all__ = [
    "FAULT_TYPES",
    "Fault",
    "FaultContext",
    "FaultLedger",
    "FaultManager",
    "FaultRecord",
    "FaultSpec",
    "FaultState",
    "Injection",
    "KillRank",
    "KillRankSpec",
    "parse_fault_request",
]
