"""The action interface: typed objects the responder runs for an incident."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pydantic import JsonValue

from stormwatch.contracts.responder import IncidentRecord


@dataclass(frozen=True, kw_only=True)
class ActionOutcome:
    """How an action ended.

    Attributes:
        status: ``succeeded`` or ``failed``.
        detail: one human-readable line (shown by ``stormwatch alerts incidents``).
        data: structured output (JSON-serialisable), stored with the action.
    """

    status: Literal["succeeded", "failed"]
    detail: str
    data: dict[str, JsonValue] = field(default_factory=dict)


class Action(abc.ABC):
    """One automatic response to an incident.

    Subclasses set :attr:`kind` and :attr:`retry_safe`, may override
    :meth:`guard`, and implement :meth:`run`. The responder stores every action
    and runs each at most once to a final state; an action interrupted by a
    responder restart is re-run only when :attr:`retry_safe` is true.

    Attributes:
        kind: unique name, stored with the action (e.g. ``confirm_restart``).
        retry_safe: True when running the action again after an interruption
            cannot do harm (read-only checks). Remedial actions (restart,
            exclude a node) must leave it False.
        stops_ranks: True when the action ends the job's rank processes (a restart): the
            rank exits from its start on are its doing, and the post-mortem does not take
            them for the incident's cause.
    """

    kind: ClassVar[str]
    retry_safe: ClassVar[bool] = False
    stops_ranks: ClassVar[bool] = False

    def guard(self, incident: IncidentRecord) -> str | None:
        """Why the action must not run for ``incident``, or None to run it.

        A refusal is stored as ``skipped`` with the reason. The default allows
        everything; remedial actions add rate limits and safety checks here.
        """
        return None

    async def precheck(self, incident: IncidentRecord) -> str | None:
        """Why the action must not run now, read from live state just before it would run
        (after :meth:`guard`, before the responder's guardrails), or None to run it.

        A refusal is stored as ``skipped`` with the reason, like :meth:`guard`'s. The
        default allows everything; restarts refuse while a node of the job is unreachable
        (:class:`~stormwatch.alerts.actions.remedial.RestartWorkers`).
        """
        return None

    def describe(self, incident: IncidentRecord) -> str:
        """What the action would do for ``incident``, one phrase (dry-run, approval, audit)."""
        return f"{self.kind} for incident {incident.id}"

    @abc.abstractmethod
    async def run(self, incident: IncidentRecord) -> ActionOutcome:
        """Carry out the action for ``incident``.

        Raising is allowed: the responder records the exception as ``failed``.
        Cancellation (responder shutdown) must be left to propagate.
        """


__all__ = ["Action", "ActionOutcome"]
