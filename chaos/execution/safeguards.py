"""Safeguards: conditions checked continuously while faults may be active (chaostoolkit's
``safeguards`` control).

:func:`watch` checks every safeguard of an experiment every ``interval_seconds``
and returns the first one that does not hold. :class:`SafeguardWatcher` runs the
method and the after-check under :func:`watch`: a trip cancels them (injection
stops) and marks the run failed; the runner then rolls back. Each trip is journaled
as a ``safeguard`` activity with what was observed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from stormwatch.chaos.execution.context import RunContext
from stormwatch.chaos.execution.probes import ProbeContext, ProbeOutcome, check
from stormwatch.chaos.experiment.model import Safeguard
from stormwatch.contracts.journal import ExperimentStatus


@dataclass(frozen=True)
class Tripped:
    """A safeguard that did not hold: which, and what its check said."""

    safeguard: Safeguard
    outcome: ProbeOutcome
    at: float


async def watch(safeguards: list[Safeguard], context: Callable[[], ProbeContext]) -> Tripped | None:
    """Check each safeguard at its interval until one fails; returns it (never returns otherwise
    while there are safeguards; returns None at once when there are none).

    ``context()`` is called before every check (the latest fault time changes the
    ``job`` provider's meaning).
    """
    if not safeguards:
        return None
    due = {guard.name: 0.0 for guard in safeguards}
    while True:
        now = time.monotonic()
        for guard in safeguards:
            if due[guard.name] > now:
                continue
            outcome = await check(guard.provider, context())
            if not outcome.ok:
                return Tripped(guard, outcome, time.time())
            due[guard.name] = time.monotonic() + guard.interval_seconds
        next_due = min(due.values())
        await asyncio.sleep(max(0.05, next_due - time.monotonic()))


class SafeguardWatcher:
    """Runs part of an experiment while its safeguards hold.

    Args:
        ctx: the run (its experiment's ``safeguards``; a trip is journaled and reported).
        context: what the checks read, called before each check (see :func:`watch`).
    """

    def __init__(self, ctx: RunContext, *, context: Callable[[], ProbeContext]) -> None:
        self._ctx = ctx
        self._context = context

    async def guard(self, body: Coroutine[Any, Any, ExperimentStatus]) -> ExperimentStatus:
        """Run ``body`` while the safeguards hold; the first that fails cancels it.

        Returns:
            ``body``'s status, or ``failed`` after a trip (the journal's ``error`` says which).
        """
        safeguards = self._ctx.experiment.safeguards
        main = asyncio.create_task(body)
        if not safeguards:
            return await main
        guard = asyncio.create_task(watch(safeguards, self._context))
        try:
            await asyncio.wait({main, guard}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            for task in (main, guard):
                task.cancel()
            await asyncio.gather(main, guard, return_exceptions=True)
            raise
        if main.done():
            guard.cancel()
            await asyncio.gather(guard, return_exceptions=True)
            return main.result()
        tripped = guard.result()
        main.cancel()
        await asyncio.gather(main, return_exceptions=True)
        assert tripped is not None
        await self._journal_trip(tripped)
        return "failed"

    async def _journal_trip(self, tripped: Tripped) -> None:
        ctx, name, detail = self._ctx, tripped.safeguard.name, tripped.outcome.detail
        async with ctx.writer.activity(
            name, "safeguard", "method", raise_on_failure=False
        ) as record:
            record.status, record.error = "failed", detail
            record.output = {"detail": detail, "observed": tripped.outcome.output}
        ctx.journal.error = f"safeguard {name} tripped: {detail}; injection stopped, rolled back"
        ctx.reporter.event(f"safeguard {name} tripped: {detail}: aborting")


__all__ = ["SafeguardWatcher", "Tripped", "watch"]
