"""The registry: every fault kind by name, and what is derived from it.

Adding a kind is one module under :mod:`stormwatch.faults.kinds` (a
:class:`~stormwatch.faults.kind.FaultKind`) and one line in :data:`REGISTRY`
(``tests/faults/test_registry.py`` checks it is complete). The order is the
catalogue's (docs/faults.md) and the order an experiment's validation errors list
the kinds in.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Union

from pydantic import Field, ValidationError

from stormwatch.faults.base import FaultRequest
from stormwatch.faults.errors import InvalidFaultRequest
from stormwatch.faults.kind import DetectClass, DetectClassBy, FaultKind
from stormwatch.faults.kinds import (
    freeze_rank,
    gpu,
    gpu_power,
    kill_rank,
    link,
    network,
    processes,
    slowdown,
    storage,
    trainer,
)
from stormwatch.faults.targeting import ExperimentFault

#: kind -> its declaration.
REGISTRY: Mapping[str, FaultKind] = MappingProxyType(
    {
        definition.kind: definition
        for definition in (
            kill_rank.KILL_RANK,
            freeze_rank.FREEZE_RANK,
            processes.FREEZE_RANKS,
            processes.KILL_TORCHRUN,
            processes.KILL_NODE_PROCESSES,
            processes.KILL_RDZV_HOST,
            processes.KILL_AGENT,
            network.PARTITION,
            network.ISOLATE_STORE,
            link.BANDWIDTH_LIMIT,
            network.PACKET_DROP,
            link.LINK_FLAP,
            slowdown.CPU_THROTTLE,
            trainer.TRAINER_FAULT,
            gpu.GPU_XID,
            gpu.GPU_THROTTLE,
            gpu.NVLINK_DOWN,
            gpu.NVLINK_ERRORS,
            gpu.GPU_LOST,
            gpu_power.GPU_POWER_CAP,
            storage.CHECKPOINT_READONLY,
            storage.CHECKPOINT_FULL,
        )
    }
)

#: The kinds a node agent applies (those with agent-side code), by name.
AGENT_KINDS: Mapping[str, FaultKind] = MappingProxyType(
    {name: d for name, d in REGISTRY.items() if d.fault is not None}
)

#: Fault kind -> the failure category it models (kinds that interrupt a job only; see
#: :attr:`~stormwatch.faults.kind.Traits.category`). Used by the game-day scorecard and
#: ``stormwatch plan`` when an experiment sets no ``expect.category``.
FAULT_CATEGORIES: Mapping[str, str] = MappingProxyType(
    {name: d.traits.category for name, d in REGISTRY.items() if d.traits.category is not None}
)

if TYPE_CHECKING:
    AnyExperimentFault = ExperimentFault
else:
    #: An experiment's ``fault:`` mapping: one of the kinds' experiment models, by ``kind``.
    AnyExperimentFault = Annotated[
        Union[tuple(d.experiment for d in REGISTRY.values())],  # noqa: UP007
        Field(discriminator="kind"),
    ]


def category_of(kind: str | None) -> str | None:
    """The failure category ``kind`` models, or None (unknown kind, or no job interruption)."""
    return FAULT_CATEGORIES.get(kind or "")


def detect_class_of(kind: str | None, fault: object = None) -> DetectClass | None:
    """The detection class of a fault of ``kind``, its
    :attr:`~stormwatch.faults.kind.Traits.detect_class`; ``fault`` (its experiment or
    request model) decides for a kind whose class depends on a field (``trainer_fault``'s
    ``point``). None: an unknown kind, or a field value without a class."""
    definition = REGISTRY.get(kind or "")
    trait = definition.traits.detect_class if definition is not None else None
    if isinstance(trait, DetectClassBy):
        return trait.of(fault)
    return trait


def parse_request(body: object, kinds: Mapping[str, FaultKind] = AGENT_KINDS) -> FaultRequest:
    """Validate a fault request body (parsed JSON) into its kind's request model.

    Raises:
        InvalidFaultRequest: not an object, unknown ``kind``, or invalid fields;
            ``problems`` names each field.
    """
    if not isinstance(body, dict):
        raise InvalidFaultRequest([("body", "must be a JSON object")])
    kind = body.get("kind")
    definition = kinds.get(kind) if isinstance(kind, str) else None
    if definition is None or definition.request is None:
        raise InvalidFaultRequest([("kind", f"must be one of {sorted(kinds)} (got {kind!r})")])
    try:
        return definition.request.model_validate(body)
    except ValidationError as exc:
        raise InvalidFaultRequest(
            [(".".join(str(p) for p in err["loc"]) or "body", err["msg"]) for err in exc.errors()]
        ) from exc


__all__ = [
    "AGENT_KINDS",
    "FAULT_CATEGORIES",
    "REGISTRY",
    "AnyExperimentFault",
    "category_of",
    "detect_class_of",
    "parse_request",
]
