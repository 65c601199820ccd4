"""stormwatch.faults: every fault kind, declared once, for the agent and the controller.

Each kind (:mod:`.kinds`, one module per kind or small family) declares a
:class:`~stormwatch.faults.kind.FaultKind`:

* its **request model** (:class:`FaultRequest` subclass): the body of the agent's
  ``POST /v1/faults``, validated by the agent (:func:`parse_request`);
* its **experiment model** (generated from the request model on top of a targeting
  base, :mod:`.targeting`): an experiment file's ``fault:`` mapping, with the
  controller-only targeting fields (``rank``, ``node``, ``nodes``/``peers``);
  :data:`AnyExperimentFault` is the union of all of them;
* its **traits** (:class:`Traits`): final, job-scoped, failure category, detection
  class (:class:`DetectClass`), target, placement onto agents, reverts itself at the
  TTL, kills the agent, needs root;
* its **agent-side code** (:class:`Fault` subclass): ``prepare``, ``inject``,
  idempotent ``revert`` (from the ledger entry alone) and ``verify``.

:data:`REGISTRY` lists them. What a kind needs from its node is in :mod:`.node`
(Protocols the agent fills in), shared limits in :mod:`.limits`, shell and process
helpers in :mod:`.system`. :mod:`.control_file` is the trainer's control file
(``<control-dir>/rank<R>.json``), the one channel through which fault points reach
the trainer. This package imports no component package (agent, trainer, chaos,
alerts, lab) and not torch.

Exceptions (:mod:`.errors`)::

    StormwatchError
    └── FaultError                  a fault could not be placed, applied or undone (HTTP 500)
        ├── InvalidFaultRequest     (a ConfigError too; 400) .problems names the fields
        ├── FaultTargetNotFound     the target is not on this node (404): nothing applied
        ├── FaultTargetAmbiguous    the target matches several processes (409)
        └── UnplaceableFault        the controller cannot place it on the cluster's agents
"""

from typing import TYPE_CHECKING, Any

from stormwatch.faults.base import Fault, FaultRequest, Injection
from stormwatch.faults.errors import (
    FaultError,
    FaultTargetAmbiguous,
    FaultTargetNotFound,
    InvalidFaultRequest,
    UnplaceableFault,
)
from stormwatch.faults.kind import (
    Blast,
    DetectClass,
    DetectClassBy,
    FaultKind,
    Placement,
    Target,
    Traits,
)
from stormwatch.faults.limits import MAX_TTL_SECONDS
from stormwatch.faults.node import FaultContext, RankDirectory, SimulatedGpus
from stormwatch.faults.targeting import AgentDirectory, ExperimentFault

if TYPE_CHECKING:
    from stormwatch.faults.registry import (
        AGENT_KINDS,
        FAULT_CATEGORIES,
        REGISTRY,
        AnyExperimentFault,
        category_of,
        detect_class_of,
        parse_request,
    )

#: Imported on first use: the registry builds every kind's models (about 0.2 CPU-seconds),
#: which the trainer, importing only :mod:`.control_file`, never needs (README.md,
#: "Benchmarks", recovery).
_REGISTRY_NAMES = frozenset(
    {
        "AGENT_KINDS",
        "FAULT_CATEGORIES",
        "REGISTRY",
        "AnyExperimentFault",
        "category_of",
        "detect_class_of",
        "parse_request",
    }
)


def __getattr__(name: str) -> Any:
    if name in _REGISTRY_NAMES:
        from stormwatch.faults import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AGENT_KINDS",
    "FAULT_CATEGORIES",
    "MAX_TTL_SECONDS",
    "REGISTRY",
    "AgentDirectory",
    "AnyExperimentFault",
    "Blast",
    "DetectClass",
    "DetectClassBy",
    "ExperimentFault",
    "Fault",
    "FaultContext",
    "FaultError",
    "FaultKind",
    "FaultRequest",
    "FaultTargetAmbiguous",
    "FaultTargetNotFound",
    "Injection",
    "InvalidFaultRequest",
    "Placement",
    "RankDirectory",
    "SimulatedGpus",
    "Target",
    "Traits",
    "UnplaceableFault",
    "category_of",
    "detect_class_of",
    "parse_request",
]
