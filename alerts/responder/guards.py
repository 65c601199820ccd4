"""Guards around every action the responder runs, and their audit trail.

:class:`Guardrails` wraps each action run (``ActionRunner`` calls
:meth:`Guardrails.run`). For remedial kinds (:data:`REMEDIAL_KINDS`), in order:

1. **circuit breaker**: after ``failures`` consecutive failed actions of the
   kind, refuse it until ``cooldown`` after the last failure;
2. **restart budget**: at most ``max_actions`` restarts (:data:`RESTART_KINDS`)
   per job within ``window``;
3. **rate limit**: at most ``max_actions`` remedial actions within ``window``;
4. **max concurrent**: at most ``max_concurrent`` remedial actions at once;
5. **approval**: kinds in ``approval_required`` wait (up to ``approval_timeout``)
   for ``stormwatch alerts approve ACTION_ID``;
6. **dry run**: with ``dry_run`` the action records what it would do and does nothing.

A refusal makes the action ``skipped`` with the reason. Read-only kinds
(``confirm_restart``, ``collect_diagnostics``, ``notify_only``) are not
limited. Every decision and outcome goes to the :class:`AuditLog`; budgets,
rate limit and breaker are computed from it, so they survive restarts. The
decisions that end an action (a refusal, a dry run, the outcome) are not written
here: :meth:`Guardrails.run` returns them as a :class:`Decision` whose audit entry
the runner stores with the action's final status, in one transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import JsonValue

from stormwatch.alerts.actions.base import Action, ActionOutcome
from stormwatch.alerts.actions.remedial import incident_job, incident_node
from stormwatch.alerts.policy import REMEDIAL_KINDS, RESTART_KINDS, Policy
from stormwatch.alerts.responder.audit import AuditEntry, AuditEvent, AuditLog
from stormwatch.alerts.responder.crashpoints import CrashPoints
from stormwatch.contracts.responder import IncidentRecord

log = logging.getLogger(__name__)

#: Seconds between approval checks while an action waits for one.
APPROVAL_POLL_S = 0.2
Status = Literal["succeeded", "failed", "skipped"]


@dataclass(frozen=True)
class Decision:
    """How a guarded action ended, and the audit entry to store with that status.

    Attributes:
        status: the action's final status.
        detail: why (the guard's reason, the outcome's detail).
        data: the outcome's data.
        audit: the entry (``skipped``, ``dry_run``, ``succeeded`` or ``failed``) the runner
            writes in the transaction that sets ``status``
            (:meth:`~stormwatch.alerts.responder.store.Store.finish_action`).
    """

    status: Status
    detail: str
    data: dict[str, JsonValue]
    audit: AuditEntry


class Guardrails:
    """Applies a policy's guards and writes the audit log.

    Args:
        policy: the validated policy (its ``guards`` and ``dry_run``).
        audit: the audit log (also the guards' durable state).
        clock: Unix time source (seconds).
        crash: test-only crash points (:mod:`~stormwatch.alerts.responder.crashpoints`).
    """

    def __init__(
        self,
        policy: Policy,
        audit: AuditLog,
        *,
        clock: Callable[[], float] = time.time,
        crash: CrashPoints | None = None,
    ) -> None:
        self.policy = policy
        self.audit = audit
        self._clock = clock
        self._crash = crash or CrashPoints()
        self._running = 0

    def entry(
        self,
        event: AuditEvent,
        kind: str,
        action_id: int,
        incident: IncidentRecord,
        reason: str,
        actor: str = "responder",
    ) -> AuditEntry:
        """The audit entry of ``event`` for action ``action_id`` of ``incident``, now."""
        return AuditEntry(
            time=self._clock(),
            actor=actor,
            event=event,
            action_id=action_id,
            incident_id=incident.id,
            kind=kind,
            job=incident_job(incident),
            node=incident_node(incident),
            reason=reason,
        )

    async def _record(
        self,
        event: AuditEvent,
        kind: str,
        action_id: int,
        incident: IncidentRecord,
        reason: str,
        *,
        once: bool = False,
    ) -> None:
        entry = self.entry(event, kind, action_id, incident, reason)
        await asyncio.to_thread(self.audit.record, entry, once=once)

    def refusal(self, kind: str, job: str | None, now: float) -> str | None:
        """Why a remedial ``kind`` for ``job`` must not start now, or None (checks 1-3)."""
        if kind not in REMEDIAL_KINDS:
            return None
        guards = self.policy.guards
        breaker = guards.circuit_breaker
        outcomes = self.audit.last_outcomes(kind, breaker.failures)
        if len(outcomes) == breaker.failures and all(o.event == "failed" for o in outcomes):
            reopen = outcomes[0].time + breaker.cooldown
            if now < reopen:
                return (
                    f"circuit breaker open: the last {breaker.failures} {kind} actions "
                    f"failed; closed again in {reopen - now:.0f} s"
                )
        budget = guards.restart_budget
        if kind in RESTART_KINDS:
            used = self.audit.count(
                event="started", kinds=RESTART_KINDS, since=now - budget.window, job=job
            )
            if used >= budget.max_actions:
                return (
                    f"restart budget exhausted: {used} restarts of job {job} within "
                    f"{budget.window:g} s (max {budget.max_actions})"
                )
        rate = guards.rate_limit
        used = self.audit.count(event="started", kinds=REMEDIAL_KINDS, since=now - rate.window)
        if used >= rate.max_actions:
            return (
                f"rate limit: {used} remedial actions within {rate.window:g} s "
                f"(max {rate.max_actions})"
            )
        return None

    async def _approved(self, action_id: int) -> bool:
        deadline = self._clock() + self.policy.guards.approval_timeout
        while self._clock() < deadline:
            if await asyncio.to_thread(self.audit.has, action_id, "approved"):
                return True
            await asyncio.sleep(APPROVAL_POLL_S)
        return False

    async def run(self, action: Action, action_id: int, incident: IncidentRecord) -> Decision:
        """Run ``action`` for ``incident`` under the guards; returns how it ended.

        Records ``awaiting_approval`` and ``started`` (once per action: a resumed action
        is not started again in the log); the ending is the returned decision's entry,
        for the caller to store with the status. An exception of the action is a
        ``failed`` outcome.
        """
        kind = action.kind
        describe = action.describe(incident)
        remedial = kind in REMEDIAL_KINDS
        job = incident_job(incident)

        def end(
            status: Status, event: AuditEvent, detail: str, data: dict[str, JsonValue] | None = None
        ) -> Decision:
            entry = self.entry(event, kind, action_id, incident, detail)
            return Decision(status, detail, dict(data or {}), entry)

        if remedial:
            if kind in self.policy.guards.approval_required:
                await self._record(
                    "awaiting_approval",
                    kind,
                    action_id,
                    incident,
                    f"{describe}; run `stormwatch alerts approve {action_id}`",
                )
                if not await self._approved(action_id):
                    late = f"not approved within {self.policy.guards.approval_timeout:g} s"
                    return end("skipped", "skipped", late)
            reason: str | None = await asyncio.to_thread(self.refusal, kind, job, self._clock())
            limit = self.policy.guards.max_concurrent
            if reason is None and self._running >= limit:  # no await between check and count
                reason = f"max concurrent actions: {self._running} running (max {limit})"
            if reason is not None:
                return end("skipped", "skipped", reason)
            if self.policy.dry_run:
                return end("succeeded", "dry_run", f"dry-run: would {describe}", {"dry_run": True})
            self._running += 1
        try:
            started = f"alert {incident.alertname}"
            await self._record("started", kind, action_id, incident, started, once=True)
            self._crash.reach("started", kind)
            try:
                outcome = await action.run(incident)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("action %d (%s) raised", action_id, kind)
                outcome = ActionOutcome(status="failed", detail=f"{type(exc).__name__}: {exc}")
            return end(outcome.status, outcome.status, outcome.detail, dict(outcome.data))
        finally:
            if remedial:
                self._running -= 1


__all__ = ["APPROVAL_POLL_S", "Decision", "Guardrails"]
