"""What every fault kind's agent side provides: a request model and an object with
``prepare`` / ``inject`` / ``revert`` / ``verify``.

Life of a fault on a node (driven by the agent's ``FaultManager``): the request
model validates the fields and the kind's cross-field checks (:attr:`FaultRequest.checks`,
each naming the field at fault, so a bad request is a validation error, HTTP 400);
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from stormwatch.faults.limits import AGENT_TTL_SECONDS, FaultId, TtlSeconds
from stormwatch.faults.node import FaultContext

#: A broken cross-field rule: the field at fault and the problem, one sentence.
Problem = tuple[str, str]
#: A cross-field rule of a kind: its :data:`Problem`, or None. It reads the fields by name,
#: so it runs on the request and on the experiment model alike.
Check = Callable[[Any], "Problem | None"]


def check_fields(model: BaseModel, checks: Sequence[Check]) -> None:
    """Run ``checks`` on ``model`` (from a pydantic ``after`` model validator).

    Raises:
        ValidationError: one error per broken rule, located at the field it names (type
            ``cross_field``), so callers report it like any other field's error.
    """
    found = [problem for check in checks if (problem := check(model)) is not None]
    if found:
        raise ValidationError.from_exception_data(
            type(model).__name__,
            [
                InitErrorDetails(
                    type=PydanticCustomError("cross_field", "{problem}", {"problem": message}),
                    loc=(field,),
                    input=getattr(model, field, None),
                )
                for field, message in found
            ],
        )


class FaultRequest(BaseModel):
    """Fields every fault request (the agent's ``POST /v1/faults`` body) has.

    Attributes:
        id: caller-chosen id; the same id twice has one effect.
        kind: the fault kind (subclasses narrow it to a literal).
        ttl_seconds: the agent reverts the fault this long after applying it,
            on its own, even across restarts (default 300 s; at most one day).
    """

    # strict: JSON types are checked, not coerced ("0" is not a rank; true is not 1).
    # allow_inf_nan=False: NaN and infinities are not numbers of seconds, watts, ...
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    #: The kind's cross-field rules (its experiment model runs the same ones).
    checks: ClassVar[tuple[Check, ...]] = ()

    id: FaultId
    kind: str
    ttl_seconds: TtlSeconds = AGENT_TTL_SECONDS

    @model_validator(mode="after")
    def _cross_field(self) -> FaultRequest:
        check_fields(self, self.checks)
        return self


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


__all__ = ["Check", "Fault", "FaultRequest", "Injection", "Problem", "RequestT", "check_fields"]
