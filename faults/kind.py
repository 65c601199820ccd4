"""One fault kind, declared once: its request model, targeting, traits and agent-side code.

A kind module builds one :class:`FaultKind` per kind and the registry
(:mod:`stormwatch.faults.registry`) lists it. From that one declaration come

* the agent's request model (:attr:`FaultKind.request`, the ``POST /v1/faults`` body),
* the experiment model (:attr:`FaultKind.experiment`, an experiment's ``fault:``
  mapping): generated from the request's fields minus what only the agent gets
  (``id``; ``job``; :attr:`FaultKind.agent_only`; what the targeting supplies) on top
  of the targeting base (:mod:`stormwatch.faults.targeting`), with the experiment's
  TTL default. Bounds, defaults and cross-field checks are therefore the same on both
  sides; :meth:`FaultKind.agent_body` turns an experiment fault back into a request;
* the traits (:class:`Traits`) the controller, the planner and the scorecard read.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any, Literal

from pydantic import Field, create_model

from stormwatch.faults.base import Check, Fault, FaultRequest, Problem
from stormwatch.faults.limits import EXPERIMENT_TTL_SECONDS, TtlSeconds
from stormwatch.faults.targeting import AgentDirectory, ExperimentFault

#: Request fields an experiment never sets (the agent-side id; the controller adds ``job``).
_ALWAYS_AGENT_ONLY = frozenset({"id", "kind", "ttl_seconds", "job"})


class Target(str, Enum):
    """What an experiment names to place the fault (its targeting fields)."""

    RANK = "rank"  #: ``rank``: one rank
    NODE_OR_RANK = "node_or_rank"  #: ``node``, or ``rank`` (the node holding it)
    NODE_SETS = "node_sets"  #: ``nodes`` (side A) and ``peers`` (side B)
    NONE = "none"  #: nothing: the fault finds its own place


class Placement(str, Enum):
    """How the controller places the fault onto node agents."""

    #: No agent: the controller signals the rank's process itself (one PID namespace).
    CONTROLLER = "controller"
    #: One agent, asked directly: the node holding the rank first, then the others.
    RANK_AGENT = "rank_agent"
    #: One request: to the named node's agent, else the node holding the rank first.
    ONE_NODE = "one_node"
    #: One request per node of side A (``<id>:<node>``), each naming side B.
    EACH_NODE = "each_node"
    #: Every agent in turn; only the one holding the target (the rendezvous host) accepts.
    EVERY_AGENT = "every_agent"


class Blast(str, Enum):
    """Which ranks count toward an experiment's blast radius."""

    TARGET = "target"  #: the rank, or every rank of the node(s) the fault names
    FIRST_NODE = "first_node"  #: every rank of the first node (it hosts the rendezvous store)
    NOTHING = "nothing"  #: no training process is touched (monitoring only)


class DetectClass(str, Enum):
    """How an alert is expected to notice a fault: the detection classes of issue 18, each
    with its own detect-time target (the targets are the game day's:
    :mod:`stormwatch.chaos.gameday.targets`). A kind declares its class once
    (:attr:`Traits.detect_class`); docs/faults.md lists them.
    """

    RANK_KILLED = "rank_killed"  #: a rank's process died (killed, crashed)
    NODE_LOST = "node_lost"  #: a node left the job (its launcher and ranks gone)
    GPU_XID = "gpu_xid"  #: a GPU reported an XID or an uncorrectable ECC error
    GPU_LOST = "gpu_lost"  #: a GPU fell off the bus
    HUNG_RANK = "hung_rank"  #: a rank stopped progressing while alive (frozen, blocked)
    #: the job blocked in a collective no rank completes (no kind of the catalogue yet:
    #: ``trainer_fault`` ``collective_hang`` blocks one rank, a hung rank)
    HUNG_COLLECTIVE = "hung_collective"
    PARTITION = "partition"  #: nodes cannot reach each other
    STORE_ISOLATION = "store_isolation"  #: a node cannot reach the rendezvous store
    NVLINK_DOWN = "nvlink_down"  #: NVLink links inactive
    AGENT_DOWN = "agent_down"  #: a node's stormwatch agent is gone (training goes on)
    NODE_DOWN = "node_down"  #: a node unreachable as a whole: its agent cannot report
    SLOW_RANK = "slow_rank"  #: one rank computes or communicates slower (a straggler)
    CPU_THROTTLE = "cpu_throttle"  #: a rank's CPU share cut (a compute straggler)
    BANDWIDTH_STARVED = "bandwidth_starved"  #: a node's link rate cut
    PACKET_LOSS = "packet_loss"  #: a node's link drops packets
    CHECKPOINT_FAILING = "checkpoint_failing"  #: checkpoint saves fail (disk full, read-only)
    GPU_THROTTLE = "gpu_throttle"  #: a GPU's clocks throttled or capped (no target in issue 18)
    NVLINK_ERRORS = "nvlink_errors"  #: an NVLink error burst (no target in issue 18)


@dataclasses.dataclass(frozen=True)
class DetectClassBy:
    """A detection class chosen by the value of one of the kind's fields (``trainer_fault``:
    by its ``point``); a value it does not list has no class.

    Attributes:
        field: the field's name, on the request and experiment models alike.
        classes: field value -> class.
    """

    field: str
    classes: Mapping[str, DetectClass]

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", MappingProxyType(dict(self.classes)))

    def of(self, fault: object) -> DetectClass | None:
        """The class of ``fault`` (a request or experiment fault of the kind)."""
        value = getattr(fault, self.field, None)
        return self.classes.get(value) if isinstance(value, str) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Traits:
    """What the controller, the planner and the scorecard need to know about a kind.

    Attributes:
        target: what an experiment names to place it.
        placement: how the controller places it onto agents.
        blast: which ranks count toward the blast radius.
        category: the failure category it models (Llama 3 Table 5 ids,
            ``plan/llama3_table5.yaml``) when it interrupts a job; None: it does not, and
            the planner uses it only where an experiment sets ``expect.category``.
        detect_class: how an alert is expected to notice it (:class:`DetectClass`; the
            game-day scorecard holds each class's detect time against its target), or a
            :class:`DetectClassBy` when one of its fields decides. Every kind has one
            (``tests/faults/test_registry.py``); None only to let a kind in progress import.
        final: a kill: nothing to undo; a revert only closes the record.
        job_scoped: the agent request carries the job's name (the agent picks its ranks).
        reverts_itself: the agent reverts it at its TTL on its own; False: the controller
            starts a reaper (the controller-side ``freeze_rank``; ``kill_agent``: a dead
            agent reverts nothing).
        kills_agent: it takes the node's agent down; a revert waits for the agent to
            answer again (restarted through the platform) before closing the record.
        needs_root: the agent needs root to apply it (iptables, tc, mounts, cgroups, NVML).
        fixed_place: why an experiment action may not give a ``target`` selector (the
            fault places itself); None: it may.
    """

    target: Target
    placement: Placement
    blast: Blast = Blast.TARGET
    category: str | None = None
    detect_class: DetectClass | DetectClassBy | None = None
    final: bool = False
    job_scoped: bool = False
    reverts_itself: bool = True
    kills_agent: bool = False
    needs_root: bool = False
    fixed_place: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class FaultKind:
    """One fault kind.

    Attributes:
        kind: its name (``kill_rank``), the ``kind`` of its requests and experiment faults.
        summary: what it models in production, one or two sentences (the experiment
            model's docstring).
        traits: see :class:`Traits`.
        targeting: the experiment model's base (controller-only targeting fields).
        request: the agent's request model; None for a controller-side kind.
        fault: the agent-side implementation; None for a controller-side kind.
        agent_only: request fields an experiment cannot set (agent defaults apply).
        ttl_default: ``ttl_seconds`` default in an experiment file, seconds.
    """

    kind: str
    summary: str
    traits: Traits
    targeting: type[ExperimentFault]
    request: type[FaultRequest] | None = None
    fault: type[Fault[Any]] | None = None
    agent_only: frozenset[str] = frozenset()
    ttl_default: float = EXPERIMENT_TTL_SECONDS

    @functools.cached_property
    def params(self) -> tuple[str, ...]:
        """Request fields an experiment sets too (in the request's order)."""
        if self.request is None:
            return ()
        skip = _ALWAYS_AGENT_ONLY | self.agent_only | self.targeting.supplies
        return tuple(name for name in self.request.model_fields if name not in skip)

    @functools.cached_property
    def experiment(self) -> type[ExperimentFault]:
        """The experiment model: targeting fields, ``kind``, the params, ``ttl_seconds``."""
        fields: dict[str, Any] = {"kind": (Literal[self.kind], ...)}
        if self.request is not None:
            for name, info in self.request.model_fields.items():
                if name in self.params:
                    fields[name] = (info.annotation, copy.deepcopy(info))
                elif name in self.targeting.in_place:
                    fields[name] = self.targeting.in_place[name]
        fields["ttl_seconds"] = (TtlSeconds, Field(default=self.ttl_default))
        name = "".join(part.title() for part in self.kind.split("_")) + "Fault"
        model: type[ExperimentFault] = create_model(
            name,
            __base__=self.targeting,
            __module__=self.targeting.__module__,
            __doc__=self.summary,
            **fields,
        )
        model.definition = self
        return model

    @property
    def checks(self) -> tuple[Check, ...]:
        """The cross-field rules (:data:`~stormwatch.faults.base.Check`), declared once on
        the request model (:attr:`FaultRequest.checks`); the experiment model runs them too."""
        return self.request.checks if self.request is not None else ()

    def problems(self, fault: object) -> list[Problem]:
        """What the cross-field checks find wrong with ``fault`` (a request or an experiment
        fault of this kind), as ``(field, problem)``; empty when nothing."""
        found = [check(fault) for check in self.checks]
        return [problem for problem in found if problem is not None]

    def agent_body(
        self, fault: ExperimentFault, *, job: str, agents: AgentDirectory
    ) -> dict[str, Any]:
        """The request body (without ``id``) for an experiment fault of this kind.

        Raises:
            UnplaceableFault: the targeting cannot be resolved on these agents.
            ValueError: a controller-side kind (no request).
        """
        if self.request is None:
            raise ValueError(f"{self.kind} is applied by the controller: it has no agent request")
        body: dict[str, Any] = {"kind": self.kind}
        body.update(fault.model_dump(mode="json", include=set(self.params), exclude_none=True))
        body["ttl_seconds"] = fault.ttl_seconds
        body.update(fault.targeting_fields(agents))
        if self.traits.job_scoped:
            body["job"] = job
        return body


__all__ = [
    "Blast",
    "Check",
    "DetectClass",
    "DetectClassBy",
    "FaultKind",
    "Placement",
    "Target",
    "Traits",
]
