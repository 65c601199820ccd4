"""Revert open faults from the ledger: used by rollbacks, abort, ``chaos revert`` and start-up recovery.

Every revert is idempotent (:func:`stormwatch.chaos.ledger.undo.undo_fault` needs only
the ledger entry) and each fault is handled on its own: one that cannot be reverted
is reported and stays open in the ledger, the others are still reverted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.ledger.undo import undo_fault
from stormwatch.contracts.fault_ledger import LedgerEntry

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


def platform_agent_restorer(ledger_file: Path) -> Callable[[str], str | None] | None:
    """How a ``kill_agent`` revert starts a dead agent again, for the ledger ``ledger_file``
    (``<run-dir>/chaos/ledger.sqlite3``): the lab of that run directory restarts the
    agent's service (:meth:`stormwatch.lab.Lab.restart_agents`); None when the run
    directory holds no lab (a DaemonSet or systemd unit restarts agents there). The
    restorer returns what it did, or None when the lab is down (the agent went with it).
    """
    from stormwatch.lab import Lab
    from stormwatch.lab.errors import LabNotUpError
    from stormwatch.lab.paths import RunPaths

    run_dir = Path(ledger_file).parent.parent
    if not RunPaths.of(run_dir).state_file.exists():
        return None

    def restore(node: str) -> str | None:
        try:
            restarted = Lab(run_dir).restart_agents([node])
        except LabNotUpError:
            return None
        return "restarted by the lab" if restarted else "already running"

    return restore


async def revert_entries(
    ledger: Ledger, entries: list[LedgerEntry], *, reason: str, session: aiohttp.ClientSession
) -> list[RevertOutcome]:
    """Revert each open entry and mark it reverted with ``reason``; closed entries are skipped.

    Never raises for a single fault's failure: it is recorded in the outcome and
    in the ledger's ``last_error``.
    """
    agents = AgentClient(session)
    restore_agent = platform_agent_restorer(ledger.path)
    outcomes: list[RevertOutcome] = []
    for entry in entries:
        current = ledger.get(entry.id)
        if not current.open:
            outcomes.append(RevertOutcome(entry.id, True, "already reverted"))
            continue
        try:
            detail = await undo_fault(
                fault_id=current.id,
                spec=current.spec,
                target=current.target,
                agents=agents,
                expires_at=current.expires_at,
                injected_at=current.injected_at,
                restore_agent=restore_agent,
            )
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


#: ``revert_reason`` of a fault reverted after its TTL by someone other than its reaper.
OVERDUE_REASON = "ttl (overdue)"


async def revert_expired(
    ledger: Ledger, *, now: float | None = None, session: aiohttp.ClientSession | None = None
) -> list[RevertOutcome]:
    """Revert every open fault whose ``expires_at`` has passed (idempotent).

    Its controller and its TTL reaper should have done so; this is the backstop
    when both died. Each revert is logged (warning).
    """
    moment = time.time() if now is None else now
    entries = [e for e in ledger.open_faults() if e.expires_at <= moment]
    if not entries:
        return []
    for entry in entries:
        logger.warning(
            "fault %s (%s, rank %s) is %.0f s past its TTL and still open: reverting it",
            entry.id,
            entry.kind,
            entry.spec.target_rank(),
            moment - entry.expires_at,
        )
    if session is not None:
        return await revert_entries(ledger, entries, reason=OVERDUE_REASON, session=session)
    async with aiohttp.ClientSession() as own:
        return await revert_entries(ledger, entries, reason=OVERDUE_REASON, session=own)


def revert_overdue(run_dir: Path) -> list[RevertOutcome]:
    """Revert the overdue faults in ``run_dir``'s ledger, if it has one (for CLI commands).

    Runs its own event loop: call it from synchronous code only.

    Raises:
        LedgerError: the ledger exists but cannot be read.
    """
    path = ledger_path(run_dir)
    if not path.exists():
        return []
    return asyncio.run(revert_expired(Ledger(path, create=False)))


__all__ = [
    "OVERDUE_REASON",
    "RevertOutcome",
    "platform_agent_restorer",
    "revert_entries",
    "revert_expired",
    "revert_open",
    "revert_overdue",
]
