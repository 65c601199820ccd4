"""The shipped Prometheus rules: promtool check and unit tests (real promtool), metadata, metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormwatch.alerts import RANK_STALLED, check_rules, rule_files, rule_test_files, run_rule_tests

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "docs" / "runbooks.md"


def _rules() -> list[dict[str, Any]]:
    rules = []
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(group["rules"])
    return rules


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def _test_cases() -> list[tuple[Path, str]]:
    cases = []
    for path in rule_test_files():
        for case in yaml.safe_load(path.read_text())["tests"]:
            cases.append((path, case["name"]))
    return cases


def _run_case(tmp_path: Path, name: str, rules: list[Path] | None = None) -> Any:
    """Run one named test group of the shipped promtool tests, against ``rules`` (default: shipped)."""
    [(path, _)] = [(p, n) for p, n in _test_cases() if n == name]
    document = yaml.safe_load(path.read_text())
    document["tests"] = [t for t in document["tests"] if t["name"] == name]
    document["rule_files"] = [
        str(p) for p in (rules or [(path.parent / f).resolve() for f in document["rule_files"]])
    ]
    single = tmp_path / f"{name}_test.yml"
    single.write_text(yaml.safe_dump(document, sort_keys=False))
    return run_rule_tests([single])


def test_shipped_rules_pass_promtool_check() -> None:
    run = check_rules()
    assert run.ok, run.output
    assert "SUCCESS" in run.output


def test_shipped_rules_pass_their_promtool_unit_tests() -> None:
    run = run_rule_tests()
    assert run.ok, run.output


def test_promtool_check_reports_a_broken_rule(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: rate(x[5m]\n")
    run = check_rules([bad])
    assert not run.ok
    assert "bad.yml" in run.output


def test_every_promtool_case_has_a_named_test() -> None:
    names = {n for _, n in _test_cases()}
    source = Path(__file__).read_text()
    assert all(f'"{n}"' in source for n in names), names


def test_rank_exit_fires_within_seconds_even_when_the_rank_is_back_at_once(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "exit_counts_even_when_the_rank_is_back_at_once")
    assert run.ok, run.output


def test_rank_exit_fires_when_the_exit_counter_appears_at_one(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "exit_counter_created_at_one_still_fires")
    assert run.ok, run.output


def test_fc03_rank_stalled_fires_once_and_resolves_by_itself(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "kill_then_restart_fires_once_and_resolves")
    assert run.ok, run.output


def test_fc01_cleanly_finished_ranks_never_alert(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "fc01_cleanly_finished_ranks_never_alert")
    assert run.ok, run.output


def test_fc01_dead_rank_frozen_gauge_stops_alerting(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "fc01_dead_rank_frozen_gauge_stops_alerting")
    assert run.ok, run.output


def test_fc10_live_rank_with_stale_heartbeat_fires(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "fc10_live_rank_with_stale_heartbeat_fires_after_threshold")
    assert run.ok, run.output


def test_fc01_case_catches_a_rule_that_judges_dead_ranks_by_heartbeat(tmp_path: Path) -> None:
    """The FC-01 unit tests have teeth: without the `up == 1` guard they fail."""
    [path] = [p for p in rule_files() if p.name == "ranks.yml"]
    text = path.read_text()
    guard = "and on (job, rank)\n                    max by (job, rank) (stormwatch_rank_up) == 1\n"
    assert guard in text
    broken = tmp_path / "ranks.yml"
    broken.write_text(text.replace(guard, ""))
    for name in (
        "fc01_cleanly_finished_ranks_never_alert",
        "fc01_dead_rank_frozen_gauge_stops_alerting",
    ):
        run = _run_case(tmp_path, name, rules=[broken])
        assert not run.ok, f"{name} passed against a rule without the up == 1 guard"


def _anchors(markdown: str) -> set[str]:
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alert_has_severity_summary_description_and_runbook_section(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in {"critical", "warning", "info"}
    annotations = alert["annotations"]
    for key in ("summary", "description", "runbook_url"):
        assert annotations.get(key), f"{alert['alert']} has no {key}"
    doc, _, anchor = annotations["runbook_url"].partition("#")
    assert doc == "docs/runbooks.md"
    assert anchor == alert["alert"].lower()
    assert anchor in _anchors(RUNBOOKS.read_text()), f"docs/runbooks.md has no section #{anchor}"


def test_every_alert_has_promtool_tests() -> None:
    tested: set[str] = set()
    for path in rule_test_files():
        for case in yaml.safe_load(path.read_text())["tests"]:
            tested.update(t["alertname"] for t in case.get("alert_rule_test", []))
    assert {a["alert"] for a in _alerts()} <= tested


def test_every_metric_the_rules_use_is_in_the_agent_catalogue() -> None:
    from stormwatch.agent.catalogue import load_catalogue

    catalogue = load_catalogue()
    recorded = {r["record"] for r in _rules() if "record" in r}
    for rule in _rules():
        for name in set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", rule["expr"])):
            if ":" in name:
                assert name in recorded, f"{name} is used but not recorded"
            elif name.startswith("stormwatch_"):
                base = re.sub(r"_(sum|count|bucket)$", "", name)
                assert name in catalogue or (
                    base in catalogue and catalogue[base].type == "histogram"
                ), f"{name} (in {rule.get('alert') or rule.get('record')}) is not in the catalogue"


def test_the_playbook_alert_is_a_shipped_alert() -> None:
    assert RANK_STALLED in {a["alert"] for a in _alerts()}
