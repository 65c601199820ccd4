"""Safeguards: conditions checked continuously while faults may be active (chaostoolkit's
``safeguards`` control).

:func:`watch` checks every safeguard of an experiment every ``interval_seconds``
and returns the first one that does not hold; the runner then cancels the method
(injection stops), marks the run failed and rolls back. Each trip is journaled as a
``safeguard`` activity with what was observed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from stormwatch.chaos.execution.probes import ProbeContext, ProbeOutcome, check
from stormwatch.chaos.experiment.model import Safeguard


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


__all__ = ["Tripped", "watch"]
