"""The responder's post-mortem writer rewrites a report written just before the recovery.

Found on a loaded CI machine: the hang incident's report was built 0.3 s before the
restarted workers' first step; by the time the writer looked, the recovery was
visible, so it never wrote the report again and it kept ``recovered_at: null``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from stormwatch.alerts.incident_report import PostMortemFiles, PostMortemWriter
from stormwatch.postmortem import IncidentPostMortem


def _files(tmp_path: Path, recovered_at: float | None) -> PostMortemFiles:
    pm = IncidentPostMortem(
        incident_id=1, alertname="StormwatchTrainingHung", job="j", group_key="g",
        status="closed", detected_at=10.0, received_at=10.5, onset_at=1.0,
        recovered_at=recovered_at,
    )  # fmt: skip
    return PostMortemFiles(
        folder=tmp_path, markdown=tmp_path / "a.md", html=tmp_path / "a.html",
        json=tmp_path / "a.json", postmortem=pm,
    )  # fmt: skip


def _written(tmp_path: Path, recovered: bool | None, first_recovered_at: float | None) -> int:
    calls: list[int] = []

    def write(incident_id: int) -> PostMortemFiles:
        calls.append(incident_id)
        return _files(tmp_path, first_recovered_at if len(calls) == 1 else 42.0)

    async def scenario() -> None:
        writer = PostMortemWriter(
            write, recovered=lambda pm: recovered, settle_s=0.0, follow_up_s=2.0, poll_s=0.05
        )
        writer.submit(1)
        await asyncio.sleep(0.5)
        await writer.aclose()

    asyncio.run(scenario())
    return len(calls)


def test_a_report_built_just_before_the_recovery_is_written_again(tmp_path: Path) -> None:
    assert _written(tmp_path, recovered=True, first_recovered_at=None) == 2


def test_a_report_that_has_the_recovery_is_written_once(tmp_path: Path) -> None:
    assert _written(tmp_path, recovered=True, first_recovered_at=5.0) == 1


def test_without_a_way_to_see_the_recovery_the_report_is_written_once(tmp_path: Path) -> None:
    assert _written(tmp_path, recovered=None, first_recovered_at=None) == 1


def _closed_after(tmp_path: Path, *, settle_s: float, submitted_s: float) -> tuple[int, float]:
    """(reports written, seconds ``aclose`` took) for a writer closed ``submitted_s`` after
    one submit, the recovery never visible (a follow-up of up to 10 minutes)."""
    calls: list[int] = []

    def write(incident_id: int) -> PostMortemFiles:
        calls.append(incident_id)
        return _files(tmp_path, None)

    async def scenario() -> float:
        writer = PostMortemWriter(
            write, recovered=lambda pm: False, settle_s=settle_s, follow_up_s=600.0, poll_s=0.05
        )
        writer.submit(1)
        await asyncio.sleep(submitted_s)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await writer.aclose(timeout=30.0)
        return loop.time() - start

    took = asyncio.run(scenario())
    return len(calls), took


def test_closing_does_not_wait_for_a_recovery_the_report_already_lacks(tmp_path: Path) -> None:
    # `lab down` gives the responder 5 s after SIGTERM: a wait for a recovery (up to
    # 10 minutes) used to hold the close for its whole 30 s timeout.
    written, took = _closed_after(tmp_path, settle_s=0.0, submitted_s=0.3)
    assert written == 1
    assert took < 2.0, took


def test_closing_right_after_a_close_still_writes_that_incidents_report(tmp_path: Path) -> None:
    # The incident closed 0.1 s before the responder was told to stop (`make demo`'s lab
    # down): its report is still written, after the settle wait.
    written, took = _closed_after(tmp_path, settle_s=0.5, submitted_s=0.1)
    assert written == 1
    assert 0.2 < took < 2.0, took
