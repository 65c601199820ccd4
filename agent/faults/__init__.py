"""Node-local faults the agent applies on request, each with a TTL and a durable ledger.

One module per kind (``kill_rank.py``; later ``freeze_rank.py`` for SIGSTOP,
``partition.py`` for iptables, ``tbf.py`` for rate limits), registered in
:data:`FAULT_TYPES`. See :mod:`.base` for the contract a kind implements.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pydantic import ValidationError

from stormwatch.agent.errors import InvalidFaultRequest
from stormwatch.agent.faults.base import Fault, FaultContext, FaultSpec, Injection
from stormwatch.agent.faults.kill_rank import KillRank, KillRankSpec
from stormwatch.agent.faults.ledger import FaultLedger, FaultRecord, FaultState
from stormwatch.agent.faults.manager import FaultManager

#: kind -> fault class. Add a kind here after writing its module.
FAULT_TYPES: Mapping[str, type[Fault]] = MappingProxyType({KillRank.kind: KillRank})


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
