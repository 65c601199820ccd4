"""The responder's background post-mortem writer: one report per closed incident, written
again once the recovery shows when the first report was too early."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stormwatch.postmortem import IncidentPostMortem

log = logging.getLogger(__name__)

#: Seconds the responder waits after an incident closed before writing its post-mortem,
#: so that the workers' last log lines and dumps are on disk.
SETTLE_SECONDS = 2.0
#: Longest wait for a recovery the first report did not see (s), and the time between looks.
FOLLOW_UP_SECONDS = 600.0
POLL_SECONDS = 5.0


@dataclass(frozen=True)
class PostMortemFiles:
    """Where one incident post-mortem was written (``folder`` holds its plots too)."""

    folder: Path
    markdown: Path
    html: Path
    json: Path
    postmortem: IncidentPostMortem


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
        follow_up_s: float = FOLLOW_UP_SECONDS,
        poll_s: float = POLL_SECONDS,
    ) -> None:
        self._write = write
        self._recovered = recovered
        self._settle_s = settle_s
        self._follow_up_s = follow_up_s
        self._poll_s = poll_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._following: set[asyncio.Task[None]] = set()  # past their first write
        self._closing = False
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
        if files.postmortem.recovered_at is not None or self._closing:
            return  # written with the recovery in it, or the responder is stopping
        task = asyncio.current_task()
        assert task is not None
        self._following.add(task)
        try:
            await self._follow_up(incident_id, files.postmortem, self._recovered)
        finally:
            self._following.discard(task)

    async def _follow_up(
        self,
        incident_id: int,
        postmortem: IncidentPostMortem,
        check: Callable[[IncidentPostMortem], bool | None],
    ) -> None:
        """Look for the recovery the report lacks (at once, then every ``poll_s``) and write
        the report again when it shows."""
        # It may already have happened in the moment between building the report and now.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._follow_up_s
        first = True
        while loop.time() < deadline:
            if not first:
                await asyncio.sleep(self._poll_s)
            try:
                seen = await asyncio.to_thread(check, postmortem)
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
        """Let every first post-mortem finish (its settle wait and its write, up to
        ``timeout`` s in all); cancel at once every wait for a recovery (an incident whose
        report was written already), then whatever is left at the timeout.

        A responder stopped right after an incident closed goes on to write that incident's
        report, within what its stop allows (``lab down`` SIGKILLs after 5 s, less than the
        settle wait and a write on a loaded lab: ``stormwatch demo`` waits for the reports
        before it brings the lab down); it does not stay up for a recovery it may wait
        10 minutes for.
        """
        self._closing = True
        for task in self._following:
            task.cancel()
        tasks = list(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


__all__ = ["SETTLE_SECONDS", "PostMortemFiles", "PostMortemWriter"]
