"""Dashboard generation: deterministic files, stable uids, complete panels, provisioning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from stormwatch.cli import root
from stormwatch.dashboards import build_all, uid_for
from stormwatch.errors import ConfigError

EXPECTED_UIDS = {
    "stormwatch-cluster-overview",
    "stormwatch-node-and-gpu",
    "stormwatch-nvlink-and-collectives",
    "stormwatch-training",
    "stormwatch-incidents",
}


def _build(out: Path, *extra: str) -> None:
    result = CliRunner().invoke(root, ["dashboards", "build", "--out", str(out), *extra])
    assert result.exit_code == 0, result.output


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        found.append(panel)
    return found


def test_build_twice_gives_byte_identical_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _build(out)
    first = _files(out)
    _build(out)
    assert _files(out) == first
    other = tmp_path / "other"
    _build(other)
    second = _files(other)
    dashboards_only = {k: v for k, v in first.items() if k.startswith("dashboards/")}
    assert {k: v for k, v in second.items() if k.startswith("dashboards/")} == dashboards_only
    assert sorted(dashboards_only) == sorted(f"dashboards/{uid}.json" for uid in EXPECTED_UIDS)
    for name, content in dashboards_only.items():
        data = json.loads(content)
        assert (
            content.decode()
            == json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
        )
        assert name == f"dashboards/{data['uid']}.json"


def test_uids_derive_from_titles() -> None:
    dashboards = build_all()
    assert set(dashboards) == EXPECTED_UIDS
    for uid, data in dashboards.items():
        assert uid == uid_for(data["title"])
        assert len(uid) <= 40


def test_every_panel_has_title_description_unit_and_datasource() -> None:
    for data in build_all().values():
        ids = []
        for panel in _panels(data):
            ids.append(panel["id"])
            if panel["type"] == "row":
                continue
            where = f"{data['title']} / {panel.get('title')}"
            assert panel.get("title"), where
            assert panel.get("description"), where
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert panel["targets"], where
            assert [t["refId"] for t in panel["targets"]] == [
                chr(ord("A") + i) for i in range(len(panel["targets"]))
            ], where
        assert len(ids) == len(set(ids)), f"{data['title']}: duplicate panel ids"


def test_every_dashboard_shows_the_stormwatch_event_annotations() -> None:
    """The chaos runner and the responder tag every annotation ``stormwatch``; each
    dashboard queries Grafana's built-in annotations for that tag."""
    for data in build_all().values():
        [query] = data["annotations"]["list"]
        assert query["enable"] is True, data["title"]
        assert query["datasource"] == {"type": "grafana", "uid": "-- Grafana --"}
        assert query["target"] == {
            "type": "tags",
            "tags": ["stormwatch"],
            "matchAny": False,
            "limit": 100,
        }


def test_template_variables() -> None:
    dashboards = build_all()
    names = {
        uid: [v["name"] for v in data["templating"]["list"]] for uid, data in dashboards.items()
    }
    assert names["stormwatch-node-and-gpu"] == ["datasource", "node", "gpu"]
    assert names["stormwatch-training"] == ["datasource", "job", "rank"]
    assert names["stormwatch-nvlink-and-collectives"] == [
        "datasource",
        "job",
        "rank",
        "node",
        "gpu",
    ]
    for data in dashboards.values():
        for variable in data["templating"]["list"]:
            if variable["type"] == "query":
                assert variable["multi"] and variable["includeAll"]
                assert variable["allValue"] == ".*"


def test_provisioning_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _build(out, "--prometheus-url", "http://10.0.0.1:9090/")
    provider = yaml.safe_load((out / "provisioning/dashboards/stormwatch.yaml").read_text())
    assert provider["apiVersion"] == 1
    (entry,) = provider["providers"]
    assert entry["type"] == "file"
    assert Path(entry["options"]["path"]) == (out / "dashboards").resolve()
    source = yaml.safe_load((out / "provisioning/datasources/stormwatch.yaml").read_text())
    (datasource,) = source["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://10.0.0.1:9090"
    assert datasource["uid"] == "stormwatch-prometheus"
    # Production defaults: the data source does not claim the organisation's default, and
    # states no scrape interval it was not told.
    assert datasource["isDefault"] is False
    assert datasource["jsonData"] == {}
    _build(out, "--prometheus-url", "http://10.0.0.1:9090/", "--scrape-interval", "30s")
    source = yaml.safe_load((out / "provisioning/datasources/stormwatch.yaml").read_text())
    assert source["datasources"][0]["jsonData"] == {"timeInterval": "30s"}


@pytest.mark.parametrize("url", ["10.0.0.1:9090", "ftp://x", "", "http://[::1", "http://h:99999"])
def test_bad_prometheus_url_is_a_config_error(tmp_path: Path, url: str) -> None:
    """Also a URL that urlsplit cannot parse (broken IPv6 literal, port out of range)."""
    result = CliRunner().invoke(
        root, ["dashboards", "build", "--out", str(tmp_path), "--prometheus-url", url]
    )
    assert isinstance(result.exception, ConfigError), result.exception
    assert "--prometheus-url" in str(result.exception)
    assert not (tmp_path / "dashboards").exists()


@pytest.mark.parametrize(
    ("interval", "message"),
    [("abc", "'abc' is not a duration"), ("0s", "must be longer than 0"), ("", "not a duration")],
)
def test_bad_scrape_interval_is_a_config_error_and_writes_nothing(
    tmp_path: Path, interval: str, message: str
) -> None:
    result = CliRunner().invoke(
        root, ["dashboards", "build", "--out", str(tmp_path), "--scrape-interval", interval]
    )
    assert isinstance(result.exception, ConfigError), result.exception
    assert str(result.exception).startswith("--scrape-interval: ")
    assert message in str(result.exception)
    assert list(tmp_path.iterdir()) == []
