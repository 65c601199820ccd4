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
