"""The soak's count, on synthetic Prometheus range results: which alerts fired, which were only
pending, their times and stretches, the event each is placed against, the evaluation pauses
read from the phase gauge, and a long window split into range queries Prometheus accepts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from stormwatch.chaos.soak.counting import (
    MAX_POINTS,
    count_alerts,
    nearest_event,
    phase_passes,
    preceding_event,
    query_window,
    stretches,
)
from stormwatch.chaos.soak.report import EventKind, SoakEvent
from stormwatch.clients.prometheus import Series

T0 = 1_767_225_600.0  # the window's first evaluation
STEP = 1.0


def _event(kind: EventKind, offset: float, detail: str = "") -> SoakEvent:
    return SoakEvent(kind=kind, at=T0 + offset, detail=detail or kind)


EVENTS = [
    _event("start", 0, "job started"),
    _event("checkpoint", 30, "step 20"),
    _event("restart", 100, "planned restart"),
    _event("eval", 150, "evaluation pause"),
    _event("resize", 200, "node1 leaves"),
    _event("end", 300, "stopped"),
]


def _alerts(
    name: str, state: str, offsets: Sequence[float], **labels: str
) -> Series:  # one ALERTS series, as Prometheus returns it
    return Series(
        {"__name__": "ALERTS", "alertname": name, "alertstate": state, **labels},
        tuple((T0 + o, 1.0) for o in offsets),
    )


def _count(firing: list[Series], pending: list[Series]):  # type: ignore[no-untyped-def]
    return count_alerts(firing, pending, EVENTS, step=STEP, window_start=T0)


@pytest.mark.parametrize(
    ("firing", "pending", "fired", "pending_only"),
    [
        pytest.param([], [], [], [], id="nothing fired or pending"),
        pytest.param(
            [_alerts("StormwatchRankStalled", "firing", range(104, 110), rank="1")],
            [_alerts("StormwatchRankStalled", "pending", [103], rank="1")],
            [("StormwatchRankStalled", {"rank": "1"}, 104, 109, 6, 1)],
            [],
            id="one alert: pending then firing counts as fired only",
        ),
        pytest.param(
            [
                _alerts("StormwatchRankStalled", "firing", [104, 105], rank="1"),
                _alerts("StormwatchRankStalled", "firing", [205, 206, 207], rank="1"),
            ],
            [],
            [("StormwatchRankStalled", {"rank": "1"}, 104, 207, 5, 2)],
            [],
            id="two stretches of one alert (two chunks, a gap) are one alert, two episodes",
        ),
        pytest.param(
            [
                _alerts("StormwatchRankStalled", "firing", [210], training_job="j", rank="3"),
                _alerts("StormwatchRankStalled", "firing", [104], training_job="j", rank="1"),
            ],
            [],
            [
                ("StormwatchRankStalled", {"training_job": "j", "rank": "1"}, 104, 104, 1, 1),
                ("StormwatchRankStalled", {"training_job": "j", "rank": "3"}, 210, 210, 1, 1),
            ],
            [],
            id="same alert, other labels: two alerts, by first firing",
        ),
        pytest.param(
            [],
            [_alerts("StormwatchTrainingHung", "pending", [150, 151, 152], training_job="j")],
            [],
            [("StormwatchTrainingHung", {"training_job": "j"}, 150, 152)],
            id="pending only is counted apart",
        ),
        pytest.param(
            [_alerts("StormwatchNodeDown", "firing", [0, 1, 2], node="node2")],
            [_alerts("StormwatchAgentFlapping", "pending", [5], node="node2")],
            [("StormwatchNodeDown", {"node": "node2"}, 0, 2, 3, 1)],
            [("StormwatchAgentFlapping", {"node": "node2"}, 5, 5)],
            id="an alert of another node, firing from the start, counts too",
        ),
    ],
)
def test_alerts_are_counted_from_their_alerts_series(
    firing: list[Series],
    pending: list[Series],
    fired: list[tuple[str, dict[str, str], float, float, float, int]],
    pending_only: list[tuple[str, dict[str, str], float, float]],
) -> None:
    got_fired, got_pending = _count(firing, pending)
    assert [
        (
            a.alertname,
            a.labels,
            a.first_firing - T0,
            a.last_firing - T0,
            a.firing_seconds,
            a.episodes,
        )
        for a in got_fired
    ] == fired
    assert [
        (p.alertname, p.labels, p.first_pending - T0, p.last_pending - T0) for p in got_pending
    ] == pending_only


def test_each_firing_stretch_names_the_event_nearest_its_start() -> None:
    series = _alerts("StormwatchRankStalled", "firing", [103, 104, 202, 203, 301], rank="0")
    (alert,), _ = _count([series], [])
    assert [(s.first - T0, s.last - T0) for s in alert.stretches] == [
        (103, 104),
        (202, 203),
        (301, 301),
    ]
    nearest = [(s.nearest.kind, s.nearest.offset_seconds) for s in alert.stretches if s.nearest]
    assert nearest == [("restart", 3), ("resize", 2), ("end", 1)]


def test_a_fired_alert_names_the_nearest_event_and_the_one_before_it() -> None:
    (stalled,), _ = _count([_alerts("StormwatchRankStalled", "firing", [104, 105], rank="1")], [])
    assert stalled.nearest is not None and stalled.preceding is not None
    assert (stalled.nearest.kind, stalled.nearest.detail) == ("restart", "planned restart")
    assert stalled.nearest.offset_seconds == pytest.approx(4.0)
    assert stalled.preceding.kind == "restart"
    assert not stalled.firing_at_start
    (early,), _ = _count([_alerts("StormwatchNodeDown", "firing", [0.4], node="n")], [])
    assert early.firing_at_start


@pytest.mark.parametrize(
    ("offset", "nearest", "nearest_offset", "preceding", "preceding_offset"),
    [
        (104, "restart", 4, "restart", 4),
        (95, "restart", -5, "checkpoint", 65),
        (125, "restart", 25, "restart", 25),  # 125 is as close to restart as to eval: earlier
        (-5, "start", -5, None, None),
        (199, "resize", -1, "eval", 49),
        (400, "end", 100, "end", 100),
    ],
)
def test_nearest_and_preceding_events(
    offset: float,
    nearest: str,
    nearest_offset: float,
    preceding: str | None,
    preceding_offset: float | None,
) -> None:
    near = nearest_event(EVENTS, T0 + offset)
    before = preceding_event(EVENTS, T0 + offset)
    assert near is not None and (near.kind, near.offset_seconds) == (nearest, nearest_offset)
    if preceding is None:
        assert before is None
    else:
        assert before is not None and (before.kind, before.offset_seconds) == (
            preceding,
            preceding_offset,
        )
    assert nearest_event([], T0) is None


@pytest.mark.parametrize(
    ("times", "runs"),
    [
        ([], []),
        ([5.0], [(5.0, 5.0)]),
        ([1.0, 2.0, 3.0], [(1.0, 3.0)]),
        ([1.0, 2.0, 3.5], [(1.0, 3.5)]),  # a gap of 1.5 intervals still joins
        ([1.0, 2.0, 3.6, 4.6], [(1.0, 2.0), (3.6, 4.6)]),
    ],
)
def test_stretches_split_at_gaps_over_one_and_a_half_intervals(
    times: list[float], runs: list[tuple[float, float]]
) -> None:
    assert stretches(times, 1.0) == runs


def test_evaluation_pauses_are_the_stretches_of_the_phase_gauge() -> None:
    rank0 = Series({"training_job": "j"}, tuple((T0 + t, T0 + 1800 + t) for t in (10, 11, 12)))
    again = Series({"training_job": "j"}, tuple((T0 + t, 1.0) for t in (60, 61)))
    assert phase_passes([rank0, again], STEP) == [(T0 + 10, T0 + 13), (T0 + 60, T0 + 62)]


class RecordingPrometheus:
    """Answers each range query with one point per step, and records the queries."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, float]] = []

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[Series]:
        self.calls.append((start, end, step))
        points = int((end - start) / step) + 1
        assert points <= 11_000, "Prometheus refuses more than 11,000 points per series"
        return [Series({"alertname": "A"}, tuple((start + i * step, 1.0) for i in range(points)))]

    def query(self, expr: str, *, at: float | None = None) -> list[object]:
        raise AssertionError("not used")

    def alerts(self) -> list[object]:
        raise AssertionError("not used")


@pytest.mark.parametrize("seconds", [0.0, 100.0, MAX_POINTS - 1.0, 25_000.0, 3 * 3600.0])
def test_a_long_window_is_read_in_queries_prometheus_accepts(seconds: float) -> None:
    prometheus = RecordingPrometheus()
    series = query_window(prometheus, "ALERTS", start=T0, end=T0 + seconds, step=1.0)  # type: ignore[arg-type]
    times = sorted(t for s in series for t, _ in s.points)
    assert times == [T0 + i for i in range(int(seconds) + 1)]  # every evaluation, once
    assert prometheus.calls[0][0] == T0 and prometheus.calls[-1][1] == T0 + seconds
