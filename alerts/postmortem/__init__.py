"""Incident post-mortems: written when an incident resolves, re-rendered on demand.

``<postmortem-dir>/incident-<id>/`` holds ``postmortem.md``, ``postmortem.html``
(self-contained: plots inlined), ``postmortem.json``
(:class:`IncidentPostMortem`) and the plots as PNG files. The responder writes
it in the background when an incident closes (every member alert resolved);
``stormwatch alerts postmortem INCIDENT`` writes it again from the same
sources (the responder's database and audit log, the lab's run directory,
Prometheus). Modules: :mod:`.sources` (reading), :mod:`.analysis` (culprit),
:mod:`.build` (times, impact, timeline), :mod:`.render` (files).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stormwatch.alerts.errors import AlertsError
from stormwatch.errors import ConfigError

if TYPE_CHECKING:
    from stormwatch.alerts.postmortem.model import IncidentPostMortem

log = logging.getLogger(__name__)

#: Seconds the responder waits after an incident closed before writing its post-mortem,
#: so that the workers' last log lines and dumps are on disk.
SETTLE_SECONDS = 2.0


class UnknownIncident(AlertsError, ConfigError):
    """The responder's database has no incident with the id given."""


@dataclass(frozen=True)
class PostMortemFiles:
    """Where one post-mortem was written."""

    folder: Path
    markdown: Path
    html: Path
    json: Path
    postmortem: IncidentPostMortem


def incident_folder(postmortem_dir: Path, incident_id: int) -> Path:
    """``<postmortem_dir>/incident-<id>``."""
    return Path(postmortem_dir) / f"incident-{incident_id}"


def write_incident_postmortem(
    *,
    db_path: Path,
    incident_id: int,
    postmortem_dir: Path,
    lab_run_dir: Path | None = None,
    prometheus_url: str | None = None,
    clock: Callable[[], float] = time.time,
) -> PostMortemFiles:
    """Build and write the post-mortem of one incident (blocking; seconds with Prometheus).

    The readers and renderers (and the chaos modules they share) are imported on
    the first call, so that starting the responder does not load them.

    Args:
        db_path: the responder's SQLite database (incidents, actions, audit log).
        incident_id: the incident.
        postmortem_dir: parent folder of ``incident-<id>/`` (created).
        lab_run_dir: the lab's run directory (rank logs, dumps, spans, agent
            events, chaos journals), or None.
        prometheus_url: Prometheus base URL for the plots and the straggler/XID
            evidence, or None (plots from the rank logs).
        clock: Unix time source.

    Raises:
        UnknownIncident: no incident ``incident_id`` (the message lists the known range).
        StoreError: the database cannot be read.
    """
    from stormwatch.alerts.postmortem.writer import write

    return write(
        db_path=db_path,
        incident_id=incident_id,
        postmortem_dir=postmortem_dir,
        lab_run_dir=lab_run_dir,
        prometheus_url=prometheus_url,
        clock=clock,
    )


def recovery_visible(pm: IncidentPostMortem, lab_run_dir: Path | None) -> bool | None:
    """Whether the job's rank logs now show a step completed by a worker started after
    the onset; None when that cannot be known (no lab run directory, job or onset)."""
    if lab_run_dir is None or pm.job is None or pm.onset_at is None:
        return None
    from stormwatch.trainer.telemetry.events import StepEvent
    from stormwatch.trainer.telemetry.ranklogs import read_job_logs

    logs_dir = Path(lab_run_dir) / "jobs" / pm.job / "logs"
    if not logs_dir.is_dir():
        return None
    onset = pm.onset_at
    return any(
        isinstance(e, StepEvent)
        for log in read_job_logs(logs_dir).values()
        for e in log.since_restart(onset)
    )


class PostMortemWriter:
    """The responder's background post-mortem writer (one task per closed incident,
    written one at a time so that a storm of resolves cannot starve the responder).

    An alert often resolves before the job has recovered (a hang alert resolves as
    soon as the restarted workers are down). When ``recovered`` says the recovery is
    not visible yet, the writer looks again every ``poll_s`` seconds for up to
    ``follow_up_s`` and writes the post-mortem once more when it is.

    Args:
        write: ``write(incident_id)`` writes one post-mortem (blocking; run on a thread).
        recovered: ``recovered(postmortem)``: True once the recovery is visible, False
            while not yet, None when it cannot be known (no follow-up).
        settle_s: wait before writing (see :data:`SETTLE_SECONDS`).
        follow_up_s: longest wait for the recovery (default 10 min).
        poll_s: seconds between two looks.
    """

    def __init__(
        self,
        write: Callable[[int], PostMortemFiles],
        *,
        recovered: Callable[[IncidentPostMortem], bool | None] | None = None,
        settle_s: float = SETTLE_SECONDS,
        follow_up_s: float = 600.0,
        poll_s: float = 5.0,
    ) -> None:
        self._write = write
        self._recovered = recovered
        self._settle_s = settle_s
        self._follow_up_s = follow_up_s
        self._poll_s = poll_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._one_at_a_time = asyncio.Semaphore(1)

    def submit(self, incident_id: int) -> None:
        """Write the post-mortem of ``incident_id`` in the background (never raises)."""
        task = asyncio.get_running_loop().create_task(
            self._run(incident_id), name=f"postmortem-{incident_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write_once(self, incident_id: int) -> PostMortemFiles | None:
        try:
            async with self._one_at_a_time:
                files = await asyncio.to_thread(self._write, incident_id)
        except Exception:
            log.exception("post-mortem of incident %d failed", incident_id)
            return None
        log.info("post-mortem of incident %d: %s", incident_id, files.html)
        return files

    async def _run(self, incident_id: int) -> None:
        await asyncio.sleep(self._settle_s)
        files = await self._write_once(incident_id)
        if files is None or self._recovered is None:
            return
        if files.postmortem.recovered_at is not None:  # written with the recovery in it
            return
        # Not in the report yet. It may already have happened in the moment between
        # building the report and now: look at once, then every poll_s.
        check = self._recovered
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._follow_up_s
        first = True
        while loop.time() < deadline:
            if not first:
                await asyncio.sleep(self._poll_s)
            try:
                seen = await asyncio.to_thread(check, files.postmortem)
            except Exception:
                log.exception("incident %d: cannot look for the recovery", incident_id)
                return
            if seen is None and first:  # cannot be known: no follow-up
                return
            first = False
            if seen:
                log.info(
                    "incident %d: the job recovered; writing its post-mortem again", incident_id
                )
                await self._write_once(incident_id)
                return
        log.info("incident %d: no recovery within %g s", incident_id, self._follow_up_s)

    async def aclose(self, timeout: float = 30.0) -> None:
        """Let post-mortems being written finish (up to ``timeout`` s); cancel the rest
        (and every wait for a recovery)."""
        tasks = list(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


__all__ = [
    "SETTLE_SECONDS",
    "PostMortemFiles",
    "PostMortemWriter",
    "UnknownIncident",
    "incident_folder",
    "recovery_visible",
    "write_incident_postmortem",
]
