"""Revert open faults from the ledger: used by rollbacks, abort, ``chaos revert`` and start-up recovery.

Every revert is idempotent (the fault kinds guarantee it) and each fault is
handled on its own: one that cannot be reverted is reported and stays open in
the ledger, the others are still reverted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import aiohttp

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.faults import bind_fault
from stormwatch.chaos.ledger import Ledger, LedgerEntry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RevertOutcome:
    """What happened to one fault.

    Attributes:
        fault_id: the ledger id.
        ok: the fault is closed in the ledger now.
        detail: what the revert did, or why it failed.
    """

    fault_id: str
    ok: bool
    detail: str


async def revert_entries(
    ledger: Ledger, entries: list[LedgerEntry], *, reason: str, session: aiohttp.ClientSession
) -> list[RevertOutcome]:
    """Revert each open entry and mark it reverted with ``reason``; closed entries are skipped.

    Never raises for a single fault's failure: it is recorded in the outcome and
    in the ledger's ``last_error``.
    """
    agents = AgentClient(session)
    outcomes: list[RevertOutcome] = []
    for entry in entries:
        current = ledger.get(entry.id)
        if not current.open:
            outcomes.append(RevertOutcome(entry.id, True, "already reverted"))
            continue
        try:
            fault = bind_fault(
                fault_id=current.id,
                spec=current.spec,
                target=current.target,
                agents=agents,
                expires_at=current.expires_at,
            )
            detail = await fault.revert()
        except ChaosError as exc:
            logger.warning("could not revert fault %s: %s", entry.id, exc)
            ledger.note_error(entry.id, str(exc))
            outcomes.append(RevertOutcome(entry.id, False, str(exc)))
            continue
        ledger.mark_reverted(entry.id, reason=reason, detail=detail)
        outcomes.append(RevertOutcome(entry.id, True, detail))
    return outcomes


async def revert_open(
    ledger: Ledger,
    *,
    reason: str,
    experiment_id: str | None = None,
    session: aiohttp.ClientSession | None = None,
) -> list[RevertOutcome]:
    """Revert every open fault (of one experiment); opens its own session when none is given."""
    entries = ledger.open_faults(experiment_id=experiment_id)
    if not entries:
        return []
    if session is not None:
        return await revert_entries(ledger, entries, reason=reason, session=session)
    async with aiohttp.ClientSession() as own:
        return await revert_entries(ledger, entries, reason=reason, session=own)


__all__ = ["RevertOutcome", "revert_entries", "revert_open"]
