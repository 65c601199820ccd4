"""Grafana annotations (:class:`Annotator`) against the stand-in Grafana on loopback.

The stand-in (``grafana`` fixture, tests/conftest.py) checks each ``POST
/api/annotations`` against Grafana's documented annotations API: Bearer token,
JSON body with ``time``/``timeEnd`` in epoch milliseconds, ``tags`` and ``text``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from stormwatch.dashboards import AnnotationSettings, Annotator
from stormwatch.errors import ConfigError

TOKEN = "glsa_test-token"  # the stand-in's (tests/conftest.py GRAFANA_TEST_TOKEN)


def test_points_and_regions_follow_the_annotations_api(grafana: Any) -> None:
    annotator = Annotator(
        AnnotationSettings(url=grafana.url, token=TOKEN, dashboard_uid="stormwatch-incidents")
    )
    annotator.annotate("fault injected", ["stormwatch", "chaos"], start=1_700_000_000.25)
    annotator.annotate("experiment", ["stormwatch"], start=1_700_000_000.0, end=1_700_000_060.5)
    annotator.close()

    assert (annotator.sent, annotator.failed, annotator.dropped) == (2, 0, 0)
    point, region = grafana.annotations
    assert point["time"] == point["timeEnd"] == 1_700_000_000_250
    assert point["tags"] == ["stormwatch", "chaos"] and point["text"] == "fault injected"
    assert point["dashboardUID"] == "stormwatch-incidents"
    assert (region["time"], region["timeEnd"]) == (1_700_000_000_000, 1_700_000_060_500)
    assert grafana.requests == [("POST", "/api/annotations")] * 2


def test_default_time_is_now(grafana: Any) -> None:
    annotator = Annotator(AnnotationSettings(url=grafana.url, token=TOKEN))
    before = time.time() * 1000
    annotator.annotate("now", ["stormwatch"])
    annotator.close()
    [note] = grafana.annotations
    assert before - 1 <= note["time"] <= time.time() * 1000
    assert "dashboardUID" not in note


def test_refused_annotation_is_counted_not_raised(grafana: Any) -> None:
    annotator = Annotator(AnnotationSettings(url=grafana.url, token="wrong"))
    annotator.annotate("refused", ["stormwatch"])
    annotator.close()
    assert (annotator.sent, annotator.failed) == (0, 1)
    assert grafana.annotations == []


def test_silent_grafana_delays_nobody_beyond_the_timeout(silent_grafana: str) -> None:
    annotator = Annotator(AnnotationSettings(url=silent_grafana, token=TOKEN, timeout=0.5))
    started = time.monotonic()
    for i in range(20):
        annotator.annotate(f"event {i}", ["stormwatch"])
    assert time.monotonic() - started < 0.1  # annotate only queues
    annotator.close()
    assert time.monotonic() - started < 0.5 + 0.5
    assert annotator.sent == 0
    # All but the one in flight when close gave up: dropped, or failed (timed out) when the
    # first post's own 0.5 s ended just before close's (cc27: 1 failed, 18 dropped, 1 in
    # flight).
    assert annotator.failed + annotator.dropped >= 19, (annotator.failed, annotator.dropped)
    annotator.annotate("after close", ["stormwatch"])  # dropped, never raises


def test_off_without_a_url() -> None:
    annotator = Annotator.from_env({})
    assert not annotator.enabled
    annotator.annotate("nothing", ["stormwatch"])
    annotator.close()
    assert (annotator.sent, annotator.failed, annotator.dropped) == (0, 0, 0)


def test_env_settings_are_validated() -> None:
    settings = AnnotationSettings.from_env(
        {"STORMWATCH_GRAFANA_URL": "http://grafana:3000/", "GRAFANA_TOKEN": "t"}
    )
    assert settings == AnnotationSettings(url="http://grafana:3000", token="t")
    with pytest.raises(ConfigError, match="GRAFANA_TOKEN"):
        AnnotationSettings.from_env({"STORMWATCH_GRAFANA_URL": "http://grafana:3000"})
    with pytest.raises(ConfigError, match="STORMWATCH_GRAFANA_URL"):
        AnnotationSettings.from_env(
            {"STORMWATCH_GRAFANA_URL": "grafana:3000", "GRAFANA_TOKEN": "t"}
        )
