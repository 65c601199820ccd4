"""Wait for the responder's post-mortems of the incidents an experiment closed.

The responder writes an incident's post-mortem in the background,
``SETTLE_SECONDS`` (:mod:`stormwatch.alerts.incident_report`) after the incident closed (so
that the workers' last lines and dumps are on disk), which takes a few seconds with
Prometheus. A controller that brings its lab down as soon as its own report is written
(``stormwatch demo``) must wait for those reports first: the lab's Prometheus and the
responder go down with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from stormwatch.chaos.execution.reporter import Reporter
from stormwatch.clients.errors import ResponderClientError
from stormwatch.clients.responder import ResponderClient
from stormwatch.contracts.responder import IncidentRecord, incident_folder
from stormwatch.errors import ConfigError
from stormwatch.postmortem.files import HTML

#: Longest wait for the responder's post-mortems (s): it starts writing 2 s after a close
#: and takes ~4 s on the lab's 2-core machine; this leaves room for a loaded one.
WAIT_SECONDS = 60.0
#: Seconds between two looks at the folder.
POLL_SECONDS = 0.5


async def incident_postmortems(
    responder: ResponderClient,
    *,
    since: float,
    folder: Path,
    reporter: Reporter,
    closing: Callable[[IncidentRecord], bool] | None = None,
    timeout: float = WAIT_SECONDS,
) -> list[Path]:
    """The responder's post-mortem pages of the incidents opened at or after ``since`` and
    closed, once the responder has written them.

    Args:
        responder: the responder's API (its incidents, read again on every look).
        since: Unix seconds (the experiment's start): older incidents are not waited for.
        folder: the responder's post-mortem folder (``--postmortem-dir``: one
            ``incident-<id>/`` each; written last, so its ``postmortem.html`` says the
            report is complete).
        reporter: what the wait is waiting for, and what it gave up on.
        closing: an open incident for which this is True is waited for to close too (the
            experiment's alert, resolved in Prometheus: Alertmanager's resolved
            notification comes up to a ``group_interval`` later); None: none.
        timeout: longest wait in seconds (:data:`WAIT_SECONDS`).

    Returns:
        The ``postmortem.html`` of each such incident that exists, by incident id; an
        incident whose report is still missing at the timeout is named to ``reporter``.
        Empty when the responder cannot be asked or closed no incident (both said to
        ``reporter``; never raises for them). An unreachable responder, a 5xx or a slow
        answer is asked again until the timeout (each request bounded by what is left of
        it); a 4xx (a wrong token: 401) or a setting error ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    pages: dict[int, Path] = {}  # as last listed
    while True:
        listed = await _incidents(responder, deadline, timeout, reporter)
        if listed is None:  # said to the reporter; what an earlier look found stays found
            return [page for _, page in sorted(pages.items()) if page.exists()]
        incidents = [i for i in listed if i.opened_at >= since]
        pages = {
            i.id: incident_folder(folder, i.id) / HTML for i in incidents if i.status == "closed"
        }
        unwritten = [i for i, page in pages.items() if not page.exists()]
        still_open = [
            i.id for i in incidents if i.status != "closed" and closing is not None and closing(i)
        ]
        if not unwritten and not still_open:
            break
        if time.monotonic() >= deadline:
            if unwritten:
                reporter.event(
                    "  the responder has not written the post-mortem of incident "
                    f"{_ids(unwritten)} within {timeout:g} s (its log says why)"
                )
            if still_open:
                reporter.event(f"  incident {_ids(still_open)} did not close within {timeout:g} s")
            break
        waiting = [f"the post-mortem of incident {_ids(unwritten)}"] if unwritten else []
        waiting += [f"incident {_ids(still_open)} to close"] if still_open else []
        reporter.status(f"waiting for the responder: {', '.join(waiting)}")
        await asyncio.sleep(POLL_SECONDS)
    if not pages and not still_open:
        reporter.event("  the responder closed no incident during the experiment")
    return [page for _, page in sorted(pages.items()) if page.exists()]


async def _incidents(
    responder: ResponderClient, deadline: float, timeout: float, reporter: Reporter
) -> list[IncidentRecord] | None:
    """The responder's incidents, asked again while it is unreachable, failing (5xx) or slow
    until ``deadline`` (monotonic s); None, said to ``reporter``, when it refused (4xx), a
    setting is wrong, or the deadline passed."""
    while True:
        try:
            return await asyncio.wait_for(
                responder.incidents(), max(deadline - time.monotonic(), POLL_SECONDS)
            )
        except (ResponderClientError, ConfigError, TimeoutError) as exc:
            status = getattr(exc, "status", None)
            what = str(exc) or "no answer in time"  # a TimeoutError says nothing itself
            refused = isinstance(exc, ConfigError) or (status is not None and status < 500)
            if refused or time.monotonic() >= deadline:
                # a refusal (401, 404...) or a setting: asking again changes nothing
                for_how_long = "" if refused else f" (for {timeout:g} s)"
                reporter.event(
                    "  the responder's incident post-mortems: cannot list incidents: "
                    f"{what}{for_how_long}"
                )
                return None
            reporter.status(f"waiting for the responder: {what}")
            await asyncio.sleep(POLL_SECONDS)


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, sorted(ids)))


__all__ = ["POLL_SECONDS", "WAIT_SECONDS", "incident_postmortems"]
