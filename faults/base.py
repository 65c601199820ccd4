"""What every fault kind's agent side provides: a request model and an object with
``prepare`` / ``inject`` / ``revert`` / ``verify``.

Life of a fault on a node (driven by the agent's ``FaultManager``): the kind's
cross-field checks run first (:meth:`stormwatch.faults.kind.FaultKind.problems`);
``prepare`` resolves the target without side effects (raising
:class:`~stormwatch.faults.errors.FaultTargetNotFound` -> 404); the ledger then
records the fault as ``injecting``; ``inject`` applies it and returns an
:class:`Injection`, stored in the ledger; ``revert`` undoes it and ends with
``verify``. ``revert`` must be idempotent and must work in a fresh process from
the ledger entry alone (the agent may have been restarted, or crashed between
recording and applying: ``injection`` is then None).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from stormwatch.faults.limits import AGENT_TTL_SECONDS, FaultId, TtlSeconds
from stormwatch.faults.node import FaultContext


class FaultRequest(BaseModel):
    """Fields every fault request (the agent's ``POST /v1/faults`` body) has.

    Attributes:
        id: caller-chosen id; the same id twice has one effect.
        kind: the fault kind (subclasses narrow it to a literal).
        ttl_seconds: the agent reverts the fault this long after applying it,
            on its own, even across restarts (default 300 s; at most one day).
    """

    # strict: JSON types are checked, not coerced ("0" is not a rank; true is not 1).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    id: FaultId
    kind: str
    ttl_seconds: TtlSeconds = AGENT_TTL_SECONDS


RequestT = TypeVar("RequestT", bound=FaultRequest)


@dataclasses.dataclass(frozen=True)
class Injection:
    """What ``inject`` did, as stored in the ledger.

    Attributes:
        target_pid: the process acted on, if any.
        details: JSON-serialisable facts ``revert`` needs (or that a post-mortem wants).
    """

    target_pid: int | None = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Fault(abc.ABC, Generic[RequestT]):
    """One fault instance on a node, built from its validated request."""

    def __init__(self, request: RequestT) -> None:
        self.request = request

    @abc.abstractmethod
    def prepare(self, ctx: FaultContext) -> None:
        """Resolve the target; no side effects.

        Raises:
            FaultTargetNotFound: the target is not on this node.
            FaultTargetAmbiguous: the request matches more than one target.
            FaultError: the node cannot take this fault (a missing tool, a bad field).
        """

    @abc.abstractmethod
    def inject(self, ctx: FaultContext) -> Injection:
        """Apply the fault (after :meth:`prepare`); nothing is left half-applied on failure.

        Raises:
            FaultError: it could not be applied.
        """

    @abc.abstractmethod
    def revert(self, ctx: FaultContext, injection: Injection | None) -> Mapping[str, Any] | None:
        """Undo the fault, then :meth:`verify`. Idempotent; works from the ledger entry alone.

        Returns:
            What the revert did, when there is something to tell (JSON-serialisable; the
            ledger keeps it under the record's ``details["revert"]``): e.g. the processes a
            kill left behind that the revert had to stop. None: nothing to tell.

        Raises:
            FaultError: it could not be undone, or is still in force (the agent retries later).
        """

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Check that no effect of this fault is left (default: nothing to check, e.g. a kill).

        Raises:
            FaultError: naming what is still in force.
        """
        return None


__all__ = ["Fault", "FaultRequest", "Injection", "RequestT"]
