"""``stormwatch dashboards push`` against a stand-in for Grafana's HTTP API on loopback.

The stand-in (aiohttp; the ``grafana`` fixture of tests/conftest.py) implements the
endpoints a push calls and checks each request against Grafana's documented HTTP API
(grafana.com/docs/grafana/latest/developers/http_api/dashboard/ and .../folder/):
Bearer token, JSON bodies, ``POST /api/dashboards/db`` with ``dashboard.uid``,
``dashboard.id`` null, ``overwrite`` and ``folderUid``.
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from stormwatch.cli import root
from stormwatch.dashboards import PushError, build_all, push
from stormwatch.errors import ConfigError

TOKEN = "glsa_test-token"  # the stand-in's (tests/conftest.py GRAFANA_TEST_TOKEN)


def _push_cli(url: str, *extra: str, token: str | None = TOKEN) -> Any:
    env = {"GRAFANA_TOKEN": token} if token is not None else {"GRAFANA_TOKEN": ""}
    return CliRunner().invoke(root, ["dashboards", "push", "--url", url, *extra], env=env)


def test_push_creates_then_reports_unchanged(grafana: Any) -> None:
    dashboards = build_all()
    first = push(grafana.url, TOKEN, dashboards, folder="Stormwatch")
    assert {r.uid: r.outcome for r in first} == dict.fromkeys(dashboards, "created")
    assert [f["title"] for f in grafana.folders] == ["Stormwatch"]
    stored = grafana.dashboards["stormwatch-training"]
    assert stored["meta"]["folderUid"] == grafana.folders[0]["uid"]
    assert stored["dashboard"]["panels"] == dashboards["stormwatch-training"]["panels"]

    grafana.requests.clear()
    second = push(grafana.url, TOKEN, dashboards, folder="Stormwatch")
    assert {r.uid: r.outcome for r in second} == dict.fromkeys(dashboards, "unchanged")
    assert all(method == "GET" for method, _ in grafana.requests), grafana.requests
    assert len(grafana.folders) == 1


def test_push_updates_what_changed(grafana: Any) -> None:
    dashboards = build_all()
    push(grafana.url, TOKEN, dashboards)
    grafana.dashboards["stormwatch-incidents"]["dashboard"]["title"] = "edited in the UI"
    results = {r.uid: r.outcome for r in push(grafana.url, TOKEN, dashboards)}
    assert results.pop("stormwatch-incidents") == "updated"
    assert set(results.values()) == {"unchanged"}
    assert grafana.dashboards["stormwatch-incidents"]["dashboard"]["version"] == 2
    # Moving to a folder is a change too.
    moved = {r.outcome for r in push(grafana.url, TOKEN, dashboards, folder="Stormwatch")}
    assert moved == {"updated"}


def test_push_cli_prints_outcomes(grafana: Any) -> None:
    result = _push_cli(grafana.url, "--folder", "Stormwatch")
    assert result.exit_code == 0, result.output
    assert result.output.count("created") == 5
    again = _push_cli(grafana.url, "--folder", "Stormwatch")
    assert again.exit_code == 0, again.output
    assert again.output.count("unchanged") == 5


def test_missing_token_names_the_variable(grafana: Any) -> None:
    result = _push_cli(grafana.url, token=None)
    assert result.exit_code != 0
    assert "GRAFANA_TOKEN" in str(result.exception)
    assert grafana.requests == []


@pytest.mark.parametrize("url", ["grafana:3000", "http://[::1", "http://h:99999"])
def test_a_url_that_does_not_parse_is_named_without_a_request(url: str) -> None:
    result = _push_cli(url)
    assert isinstance(result.exception, ConfigError), result.exception
    assert "--url" in str(result.exception)


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_a_timeout_that_is_not_positive_is_a_usage_error(timeout: str) -> None:
    result = _push_cli("http://127.0.0.1:9", "--timeout", timeout)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--timeout'" in result.output


def test_wrong_token_is_a_push_error(grafana: Any) -> None:
    with pytest.raises(PushError, match="refused"):
        push(grafana.url, "wrong", build_all())


def test_unreachable_grafana_is_a_push_error(grafana: Any) -> None:
    with pytest.raises(PushError, match="cannot reach"):
        push("http://127.0.0.1:9", TOKEN, build_all(), timeout=2)
