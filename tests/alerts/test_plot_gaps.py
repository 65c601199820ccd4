"""An incident's Prometheus plots break their lines where a series had no samples."""

from __future__ import annotations

import math

from stormwatch.alerts.incident_report.queries import broken_at_gaps


def test_a_gap_of_more_than_a_step_gets_a_nan_that_breaks_the_line() -> None:
    # fresh-user finding: the step-time plot drew the restart's outage as a slope
    points = [(100.0, 0.2), (101.0, 0.2), (102.0, 0.3), (110.0, 0.5), (111.0, 0.2)]
    out = broken_at_gaps(points, 1.0)
    assert [t for t, _ in out] == [100.0, 101.0, 102.0, 106.0, 110.0, 111.0]
    assert math.isnan(out[3][1]) and not any(
        math.isnan(v) for i, (_, v) in enumerate(out) if i != 3
    )


def test_points_one_step_apart_or_jittered_are_left_alone() -> None:
    points = [(0.0, 1.0), (2.0, 1.0), (4.9, 1.0), (6.0, 2.0)]  # step 2 s: 2.9 s is not a gap
    assert broken_at_gaps(points, 2.0) == points
    assert broken_at_gaps([], 1.0) == []
