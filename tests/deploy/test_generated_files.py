"""The generated manifests are current, deterministic, and repeat the code exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormwatch.alerts.rulefiles import rule_files
from stormwatch.dashboards.render import build_all


def _generated(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for sub in ("base", "examples", "helm")
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, kit: Any) -> Path:
    """One run of deploy/render.py into a fresh folder, shared: the tests only read it or
    edit a copy."""
    out = tmp_path_factory.mktemp("rendered")
    done = kit.render(out)
    assert done.returncode == 0, done.stderr
    return out


def test_regenerating_gives_the_checked_in_files_byte_for_byte(rendered: Path, kit: Any) -> None:
    fresh, checked_in = _generated(rendered), _generated(kit.kubernetes)
    assert sorted(fresh) == sorted(checked_in)
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert not stale, f"stale generated files {stale}: run `make deploy-manifests`"


def test_check_mode_reports_a_hand_edited_file_and_writes_nothing(
    tmp_path: Path, rendered: Path, kit: Any
) -> None:
    shutil.copytree(rendered, tmp_path, dirs_exist_ok=True)
    rule = tmp_path / "base" / "prometheusrule.yaml"
    rule.write_text(rule.read_text() + "# edited by hand\n")
    before = rule.read_bytes()
    done = kit.render(tmp_path, "--check")
    assert done.returncode == 1
    assert "base/prometheusrule.yaml" in done.stdout
    assert "a hand edit is overwritten" in done.stdout, "says why the edit cannot stay"
    assert "make deploy-manifests" in done.stdout, "says what to run"
    assert rule.read_bytes() == before


def test_prometheus_rule_holds_exactly_the_rules_of_alerts_rules(kit: Any) -> None:
    (rule,) = kit.load_objects((kit.kubernetes / "base" / "prometheusrule.yaml").read_text())
    expected = [
        group
        for path in rule_files()
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    ]
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == expected
    names = [r.get("alert") or r.get("record") for g in expected for r in g["rules"]]
    assert len(names) > 20 and "StormwatchRankStalled" in names


def test_each_dashboard_is_a_configmap_for_the_grafana_sidecar(kit: Any) -> None:
    maps = kit.load_objects((kit.kubernetes / "base" / "dashboards.yaml").read_text())
    built = build_all()
    assert {m["metadata"]["name"] for m in maps} == {f"dashboard-{uid}" for uid in built}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == built[key.removesuffix(".json")]
