"""Applying, listing, reverting and expiring faults against the durable ledger."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from opentelemetry import trace
from pydantic import ValidationError

from stormwatch import faults as fault_kinds
from stormwatch.agent.errors import FaultConflict, FaultNotFound
from stormwatch.agent.faults.ledger import FaultLedger, FaultRecord, FaultState
from stormwatch.faults import (
    Fault,
    FaultContext,
    FaultError,
    FaultKind,
    FaultRequest,
    FaultTargetNotFound,
)

log = logging.getLogger(__name__)


class FaultManager:
    """The agent's fault engine. Thread-safe (one operation at a time).

    Args:
        ledger: durable store.
        ctx: what faults act on.
        kinds: kind name -> its declaration (default: every kind an agent applies,
            :data:`stormwatch.faults.AGENT_KINDS`, read on the first apply or revert: the
            registry builds every kind's models, about 3 MiB of the agent's memory and
            0.1 CPU-second that an agent never asked for a fault does not pay; README.md,
            "Benchmarks").
        clock: Unix time.
        tracer: records a ``fault.inject`` / ``fault.revert`` span per action
            (default: no-op).
    """

    def __init__(
        self,
        ledger: FaultLedger,
        ctx: FaultContext,
        *,
        kinds: Mapping[str, FaultKind] | None = None,
        clock: Callable[[], float] = time.time,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._ledger = ledger
        self._ctx = ctx
        self._kind_map = dict(kinds) if kinds is not None else None
        self._clock = clock
        self._tracer = tracer or trace.NoOpTracer()
        self._lock = threading.RLock()
        #: Earliest TTL among the active faults as of the last ledger read, lowered by each
        #: apply (-inf: not read yet, +inf: none). Only this manager adds faults to its
        #: ledger (one agent per state dir); others may only revert them, which can
        #: leave this early, never late.
        self._next_expiry = float("-inf")

    @property
    def _kinds(self) -> dict[str, FaultKind]:
        if self._kind_map is None:
            self._kind_map = dict(fault_kinds.AGENT_KINDS)
        return self._kind_map

    @property
    def ledger(self) -> FaultLedger:
        return self._ledger

    def apply(self, spec: FaultRequest) -> tuple[FaultRecord, bool]:
        """Apply ``spec`` once.

        Returns:
            (record, created): ``created`` is False when the id was seen before
            (same request: one effect, the earlier record is returned).

        Raises:
            FaultConflict: the id exists with a different request, or its fault failed
                (409; a retry takes a new id).
            FaultTargetNotFound / FaultTargetAmbiguous: nothing was applied.
            FaultError: applying failed (recorded as ``failed``).
        """
        attributes = {
            f"stormwatch.fault.{key}": value
            for key, value in spec.model_dump(mode="json").items()
            if isinstance(value, str | int | float | bool)
        }
        attributes["stormwatch.node"] = self._ctx.node
        with self._tracer.start_as_current_span("fault.inject", attributes=attributes) as span:
            record, created = self._apply(spec)
            span.set_attribute("stormwatch.fault.created", created)
            span.set_attribute("stormwatch.fault.state", str(record.state.value))
            if record.target_pid is not None:
                span.set_attribute("stormwatch.fault.target_pid", record.target_pid)
            return record, created

    def _apply(self, spec: FaultRequest) -> tuple[FaultRecord, bool]:
        body = spec.model_dump(mode="json")
        with self._lock:
            existing = self._ledger.get(spec.id)
            if existing is not None:
                if existing.spec != body:
                    raise FaultConflict(
                        f"fault {spec.id!r} exists with another request; use a new id"
                    )
                if existing.state is FaultState.FAILED:
                    # A replay must not read as success, nor silently try again under an id
                    # whose record says it failed: the caller chooses to retry, with a new id.
                    raise FaultConflict(
                        f"fault {spec.id!r} failed when it was applied ({existing.error}); "
                        "nothing of it is in force. To try again, POST it with a new id"
                    )
                return existing, False
            fault = self._bind(spec)
            fault.prepare(self._ctx)
            now = self._clock()
            self._next_expiry = min(self._next_expiry, now + spec.ttl_seconds)
            self._ledger.record_injecting(
                id=spec.id,
                kind=spec.kind,
                node=self._ctx.node,
                spec=body,
                created_at=now,
                expires_at=now + spec.ttl_seconds,
            )
            try:
                injection = fault.inject(self._ctx)
            except FaultTargetNotFound:
                self._ledger.delete(spec.id)  # no effect happened; the id may be reused
                raise
            except Exception as exc:
                self._ledger.mark_failed(spec.id, f"{type(exc).__name__}: {exc}")
                if isinstance(exc, FaultError):
                    raise
                raise FaultError(f"{spec.kind} {spec.id!r} failed: {exc}") from exc
            applied = self._clock()
            record = self._ledger.mark_applied(
                spec.id,
                applied_at=applied,
                expires_at=applied + spec.ttl_seconds,
                injection=injection,
            )
            log.warning("fault %s (%s) applied: pid %s", spec.id, spec.kind, record.target_pid)
            return record, True

    def _bind(self, spec: FaultRequest) -> Fault[FaultRequest]:
        """The agent-side fault of ``spec`` (validated, cross-field rules included, by its
        request model: :func:`stormwatch.faults.parse_request` answers 400 before this)."""
        definition = self._kinds[spec.kind]
        assert definition.fault is not None  # AGENT_KINDS only
        return definition.fault(spec)

    def get(self, fault_id: str) -> FaultRecord:
        """The record of ``fault_id``; raises :class:`FaultNotFound`."""
        record = self._ledger.get(fault_id)
        if record is None:
            raise FaultNotFound(f"no fault {fault_id!r} on this node")
        return record

    def records(self) -> list[FaultRecord]:
        """Every fault this agent's ledger holds, oldest first."""
        return self._ledger.all()

    def revert(self, fault_id: str, *, reason: str = "request") -> FaultRecord:
        """Revert ``fault_id`` now (idempotent: an inactive fault is returned unchanged).

        Raises:
            FaultNotFound: unknown id.
            FaultError: the revert failed (the fault stays active and is retried).
        """
        attributes = {
            "stormwatch.fault.id": fault_id,
            "stormwatch.fault.revert_reason": reason,
            "stormwatch.node": self._ctx.node,
        }
        with self._tracer.start_as_current_span("fault.revert", attributes=attributes) as span:
            record = self._revert(fault_id, reason)
            span.set_attribute("stormwatch.fault.kind", record.kind)
            span.set_attribute("stormwatch.fault.state", str(record.state.value))
            if record.revert_reason is not None:
                span.set_attribute("stormwatch.fault.reverted_for", record.revert_reason)
            return record

    def _revert(self, fault_id: str, reason: str) -> FaultRecord:
        with self._lock:
            record = self.get(fault_id)
            if not record.active:
                return record
            definition = self._kinds.get(record.kind)
            if definition is None or definition.request is None:
                raise FaultError(
                    f"fault {fault_id!r} has kind {record.kind!r}, unknown to this agent"
                )
            try:
                request = definition.request.model_validate(record.spec)
            except ValidationError as exc:  # written by an agent with other rules
                raise FaultError(
                    f"fault {fault_id!r}: its recorded request no longer validates ({exc}); "
                    "undo it by hand"
                ) from exc
            fault = self._bind(request)
            try:
                outcome = fault.revert(self._ctx, record.injection)
            except Exception as exc:
                self._ledger.note_error(fault_id, f"revert: {type(exc).__name__}: {exc}")
                if isinstance(exc, FaultError):
                    raise
                raise FaultError(f"reverting {fault_id!r} failed: {exc}") from exc
            reverted = self._ledger.mark_reverted(
                fault_id, at=self._clock(), reason=reason, outcome=outcome
            )
            log.warning("fault %s (%s) reverted: %s", fault_id, record.kind, reason)
            return reverted

    def expiry_due(self) -> bool:
        """Whether :meth:`revert_expired` may find something to revert: a fault's TTL has
        passed, or the ledger was not read yet. Reads no ledger (the agent asks 4 times a
        second; the SQLite read and the executor hop it saves were ~0.3 % of a core)."""
        return self._clock() >= self._next_expiry

    def revert_expired(self) -> list[FaultRecord]:
        """Revert every active fault whose TTL has passed; errors are logged and retried later."""
        with self._lock:
            now = self._clock()
            done = []
            pending = float("inf")
            for record in self._ledger.active():
                if record.expires_at > now:
                    pending = min(pending, record.expires_at)
                    continue
                try:
                    done.append(self.revert(record.id, reason="ttl"))
                except FaultError as exc:
                    log.error("fault %s: TTL revert failed (will retry): %s", record.id, exc)
                    pending = now  # retried at the next check
            self._next_expiry = pending
            return done

    def recover(self) -> list[FaultRecord]:
        """At start-up: revert faults left half-applied by a crash, then expired ones."""
        done = []
        for record in self._ledger.active():
            if record.applied_at is None:
                try:
                    done.append(self.revert(record.id, reason="startup"))
                except FaultError as exc:
                    log.error("fault %s: start-up revert failed (will retry): %s", record.id, exc)
        done.extend(self.revert_expired())
        return done


__all__ = ["FaultManager"]
