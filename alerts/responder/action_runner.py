"""Runs incidents' actions in the background, at most once each.

The web handler only stores the notification and hands new action ids to
:class:`ActionRunner`; the runner claims each action in the database
(pending -> running) before running it, so a duplicate submission, a second
responder or a restart cannot run it twice. Its final status and the audit entry
of how it ended are written in one transaction, so a SIGKILL between the two
cannot leave an action audited as finished but still ``running`` (which a restart
would run again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pydantic import JsonValue

from stormwatch.alerts.actions.base import ActionOutcome
from stormwatch.alerts.actions.playbook import Playbook
from stormwatch.alerts.responder.audit import AuditEntry
from stormwatch.alerts.responder.crashpoints import CrashPoints
from stormwatch.alerts.responder.guards import Guardrails
from stormwatch.alerts.responder.store import Store
from stormwatch.dashboards.annotations import Annotator

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreWorker:
    """Runs :class:`Store` calls on one dedicated thread (SQLite fsyncs off the event loop)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="responder-db")

    async def run(self, call: Callable[[Store], T]) -> T:
        """``call(store)`` on the database thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, call, self.store)

    def close(self) -> None:
        """Wait for queued calls, then close the database."""
        self._pool.shutdown(wait=True)
        self.store.close()


class ActionRunner:
    """Background execution of stored actions.

    Args:
        db: the database worker.
        playbook: maps an action's kind to its object.
        clock: Unix time source (seconds).
        guardrails: guards and audit log every run goes through (None: run unguarded).
        annotator: posts one Grafana annotation per finished action (None: none).
        crash: test-only crash points (:mod:`~stormwatch.alerts.responder.crashpoints`).
    """

    def __init__(
        self,
        db: StoreWorker,
        playbook: Playbook,
        *,
        clock: Callable[[], float] = time.time,
        guardrails: Guardrails | None = None,
        annotator: Annotator | None = None,
        crash: CrashPoints | None = None,
    ) -> None:
        self._db = db
        self._crash = crash or CrashPoints()
        self._annotator = annotator or Annotator(None)
        self._playbook = playbook
        self._clock = clock
        self._guardrails = guardrails
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, action_id: int) -> None:
        """Start action ``action_id`` in the background (no effect if it is not pending)."""
        task = asyncio.get_running_loop().create_task(
            self._run(action_id), name=f"action-{action_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Cancel running actions; they stay ``running`` and are recovered at the next start."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, action_id: int) -> None:
        try:
            await self._run_once(action_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The action itself is guarded below; this is a database failure. Keep the
            # process alive: the action stays pending/running and is recovered on restart.
            log.exception("action %d: bookkeeping failed", action_id)

    async def _run_once(self, action_id: int) -> None:
        now = self._clock()
        if not await self._db.run(lambda s: s.claim_action(action_id, now=now)):
            log.debug("action %d is not pending; not running it again", action_id)
            return
        record = await self._db.run(lambda s: s.action(action_id))
        incident = (
            await self._db.run(lambda s: s.incident(record.incident_id))
            if record is not None
            else None
        )
        if record is None or incident is None:  # pragma: no cover - foreign keys prevent it
            log.error("action %d or its incident vanished from the database", action_id)
            return
        action = self._playbook.action(record.kind)
        status: str
        detail: str
        data: dict[str, JsonValue]
        entry: AuditEntry | None = None
        if action is None:
            status, detail, data = (
                "failed",
                f"no action of kind {record.kind!r} in the playbook",
                {},
            )
        elif (reason := action.guard(incident) or await action.precheck(incident)) is not None:
            status, detail, data = "skipped", reason, {}
        elif self._guardrails is not None:
            log.info("action %d (%s) for incident %d: guarded", action_id, record.kind, incident.id)
            decision = await self._guardrails.run(action, action_id, incident)
            status, detail, data, entry = (
                decision.status,
                decision.detail,
                decision.data,
                decision.audit,
            )
        else:
            log.info("action %d (%s) for incident %d: started", action_id, record.kind, incident.id)
            try:
                outcome = await action.run(incident)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("action %d (%s) raised", action_id, record.kind)
                outcome = ActionOutcome(status="failed", detail=f"{type(exc).__name__}: {exc}")
            status, detail, data = outcome.status, outcome.detail, dict(outcome.data)
        finished = self._clock()
        self._crash.reach("outcome", record.kind)
        await self._db.run(
            lambda s: s.finish_action(
                action_id, status=status, detail=detail, data=data, now=finished, audit=entry
            )
        )
        if self._guardrails is not None:
            await asyncio.to_thread(self._guardrails.audit.sync_mirror)
        log.info("action %d (%s): %s: %s", action_id, record.kind, status, detail)
        self._annotator.annotate(
            f"action {action_id} ({record.kind}) for incident {incident.id}: {status}: {detail}",
            ("stormwatch", "action", f"action-{status}", record.kind),
            start=now,
            end=finished,
        )


__all__ = ["ActionRunner", "StoreWorker"]
