"""The soak's plan, alert counting and report (fast; the lab soak is tests/lab/test_soak_lab.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormwatch.chaos.gameday.soak import (
    SoakEvent,
    SoakPlan,
    SoakReport,
    fired_alerts,
    render_markdown,
    write_report,
)
from stormwatch.clients.prometheus import Series
from stormwatch.errors import ConfigError


def _series(name: str, points: list[float], **labels: str) -> Series:
    return Series(
        labels={"__name__": "ALERTS", "alertname": name, "alertstate": "firing", **labels},
        points=tuple((t, 1.0) for t in points),
    )


def test_each_firing_episode_of_each_label_set_counts_once() -> None:
    series = [
        # fires 100-104, resolves, fires again 120-121: two episodes
        _series("StormwatchRankStalled", [100, 101, 102, 103, 104, 120, 121], rank="1"),
        # one missed evaluation (a 2 s gap) is the same episode
        _series("StormwatchNodeDown", [50, 51, 53, 54], node="node1"),
        _series("StormwatchRankStalled", [110], rank="2"),
    ]
    alerts = fired_alerts(series)
    assert [
        (a.alertname, a.labels.get("rank") or a.labels.get("node"), a.firing_at) for a in alerts
    ] == [
        ("StormwatchNodeDown", "node1", 50),
        ("StormwatchRankStalled", "1", 100),
        ("StormwatchRankStalled", "2", 110),
        ("StormwatchRankStalled", "1", 120),
    ]
    assert alerts[0].resolved_at == 55 and "alertstate" not in alerts[0].labels
    assert fired_alerts([]) == []


def test_the_plan_restarts_then_resizes_and_rejoins_before_the_end() -> None:
    plan = SoakPlan(minutes=10, rejoin_after_seconds=60)
    assert plan.schedule() == [
        (240.0, "restart"),
        (420.0, "leave"),
        (480.0, "rejoin"),
        (600.0, "stop"),
    ]
    short = SoakPlan(minutes=1, restart_at=None, resize_at=0.9, rejoin_after_seconds=60)
    assert short.schedule() == [(54.0, "leave"), (60.0, "rejoin"), (60.0, "stop")]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"minutes": 0}, "minutes"),
        ({"restart_at": 1.0}, "restart_at"),
        ({"resize_at": 0}, "resize_at"),
    ],
)
def test_soak_plan_names_the_bad_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        SoakPlan(**kwargs)  # type: ignore[arg-type]


def test_the_report_passes_only_without_alerts(tmp_path: Path) -> None:
    report = SoakReport(job="soak", minutes=1.0, started_at=1000.0, ended_at=1075.0)
    report.events.append(SoakEvent(at=1000.0, action="start", detail="job soak"))
    assert report.ok and report.false_alarms == 0
    assert "**0 alert(s) fired**" in render_markdown(report)
    report.alerts = fired_alerts([_series("StormwatchTrainingHung", [1030, 1031], job="soak")])
    assert not report.ok and report.false_alarms == 1
    md, js = write_report(report, tmp_path / "soak")
    assert "| StormwatchTrainingHung |" in md.read_text()
    assert SoakReport.model_validate_json(js.read_text()).false_alarms == 1
