"""Which trace spans an incident's timeline shows, and where (fresh-user finding, 2026-12-06:
a `step (error)` row at -0.1 s read as failing before the fault that killed it)."""

from __future__ import annotations

from typing import Any, cast

from stormwatch.alerts.incident_report.sources import Inputs, Span
from stormwatch.alerts.incident_report.timeline_rows import _span_rows
from stormwatch.postmortem import TimelineEvent
from stormwatch.postmortem.text import format_clock
from stormwatch.postmortem.timeline import capped, within


def _events(*spans: Span) -> list[TimelineEvent]:
    inputs = Inputs(
        incident=cast(Any, None), actions=[], audit=[], window=(0.0, 100.0), spans=list(spans)
    )
    return _span_rows(inputs)


def _rows(*spans: Span) -> list[tuple[float | None, str, str]]:
    return [(row.at, row.event, row.detail) for row in _events(*spans)]


def test_an_error_span_is_placed_when_it_ended_and_says_so() -> None:
    steps = [Span("step", 0, 10.0 + i, 10.5 + i, error=False) for i in range(5)]
    killed = Span("step", 0, 49.9, 50.7, error=True)  # the fault landed at 50.0
    assert _rows(*steps, killed) == [
        (50.7, "trace: step (error)", "ended in an error after 0.80 s")
    ]


def test_a_span_with_a_step_names_it() -> None:
    """Fresh-user pass: the save rows gave no step, beside "resumed from step 20"."""
    save = Span("checkpoint_save", 0, 40.0, 40.3, error=False, step=20)
    assert _rows(save) == [(40.0, "trace: checkpoint_save of step 20 (span)", "0.30 s")]


def test_a_checkpoint_or_slow_span_is_placed_when_it_began() -> None:
    steps = [Span("step", 1, 10.0 + i, 10.5 + i, error=False) for i in range(5)]
    slow = Span("step", 1, 30.0, 33.0, error=False)
    save = Span("checkpoint_save", 1, 40.0, 40.2, error=False)
    assert _rows(*steps, slow, save) == [
        (30.0, "trace: step (slow)", "3.00 s"),
        (40.0, "trace: checkpoint_save (span)", "0.20 s"),
    ]


def test_an_error_span_that_ended_after_the_window_is_placed_when_it_began() -> None:
    """Breaker's finding: placed at its end, past the window, the row was dropped."""
    timed_out = Span("step", 0, 60.0, 700.0, error=True)  # a collective timeout, 10 min on
    [(at, event, detail)] = _rows(timed_out)
    assert (at, event) == (60.0, "trace: step (error)")
    assert (
        detail
        == f"began here; ended in an error after 640.00 s, at {format_clock(700.0)}, after the window"
    )


def test_an_error_span_across_the_whole_window_is_shown_at_its_start() -> None:
    """Breaker, second pass: one that began before the window was still dropped."""
    across = Span("allreduce", 1, -50.0, 800.0, error=True)
    rows = _rows(across)
    assert [(at, event) for at, event, _ in rows] == [(0.0, "trace: allreduce (error)")]
    assert rows[0][2].startswith(f"began at {format_clock(-50.0)}, before the window; ")
    assert [row.at for row in within(_events(across), 0.0, 100.0)] == [0.0]


def test_an_error_span_ending_within_the_windows_slack_stays_at_its_end() -> None:
    # the timeline keeps rows up to 1 s past the window's end (WINDOW_SLACK_SECONDS)
    assert _rows(Span("step", 0, 90.0, 100.5, error=True))[0][0] == 100.5


def test_routine_checkpoint_spans_are_shown_for_one_rank() -> None:
    """Fresh user: every rank's saves gave 16 rows before the fault; one rank's say it."""
    saves = [
        Span("checkpoint_save", r, 40.0 + r / 100, 40.3, error=False, step=20) for r in (2, 0, 1)
    ]
    failed = Span("checkpoint_save", 3, 60.0, 60.5, error=True, step=25)
    assert [(e, d) for _, e, d in _rows(*saves, failed)] == [
        ("trace: checkpoint_save of step 20 (span)", "0.30 s"),
        ("trace: checkpoint_save of step 25 (error)", "ended in an error after 0.50 s"),
    ]
    assert _events(*saves)[0].source == "trace rank 0"


def test_rows_left_out_say_from_when_to_when() -> None:
    rows = [TimelineEvent(at=float(t), event="e", source="s") for t in range(5)]
    notes: list[str] = []
    assert len(capped(rows, "trace span", notes, limit=3)) == 3
    assert notes == [
        f"timeline: 2 more trace span events left out, {format_clock(3.0)} to {format_clock(4.0)}"
    ]


def test_checkpoint_rows_come_from_the_lowest_rank_that_has_checkpoint_spans() -> None:
    """Breaker: rank 0 with only step spans hid every other rank's loads."""
    step = Span("step", 0, 10.0, 10.5, error=False)
    loads = [Span("checkpoint_load", r, 20.0, 21.0, error=False, step=5) for r in (4, 3)]
    assert [row.source for row in _events(step, *loads)] == ["trace rank 3"]
