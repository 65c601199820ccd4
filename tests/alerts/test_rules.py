"""The shipped Prometheus rules: promtool check and unit tests (real promtool), metadata, metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormwatch.alerts import (
    INVENTORY_METRIC,
    RANK_STALLED,
    check_rules,
    rule_files,
    rule_test_files,
    run_rule_tests,
)
from stormwatch.alerts.rulefiles import (
    DEFAULT_RUNBOOK_BASE_URL,
    render_rules_cmd,
    rule_groups,
    write_rule_files,
)
from stormwatch.durations import parse_duration
from stormwatch.errors import ConfigError

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


def test_a_rank_that_outlives_its_launcher_alerts_after_five_minutes_and_resolves(
    tmp_path: Path,
) -> None:
    run = _run_case(tmp_path, "rank_orphaned_past_five_minutes_fires_and_resolves_when_it_is_gone")
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


def test_slow_agent_render_alerts_before_a_scrape_reaches_its_timeout(tmp_path: Path) -> None:
    """Renders at 0.6 s (the lab's scrape timeout is 1 s) fire StormwatchAgentRenderSlow
    while scrapes still succeed; fast renders again resolve it."""
    run = _run_case(tmp_path, "render_slow_fires_before_the_scrape_timeout_and_resolves")
    assert run.ok, run.output


def test_fc01_case_catches_a_rule_that_judges_dead_ranks_by_heartbeat(tmp_path: Path) -> None:
    """The FC-01 unit tests have teeth: without the `up == 1` guard they fail."""
    [path] = [p for p in rule_files() if p.name == "ranks.yml"]
    text = path.read_text()
    guard = (
        "and on (training_job, rank)\n"
        "                    max by (training_job, rank) (stormwatch_rank_up) == 1\n"
    )
    assert guard in text
    broken = tmp_path / "ranks.yml"
    broken.write_text(text.replace(guard, ""))
    for name in (
        "fc01_cleanly_finished_ranks_never_alert",
        "fc01_dead_rank_frozen_gauge_stops_alerting",
    ):
        run = _run_case(tmp_path, name, rules=[broken])
        assert not run.ok, f"{name} passed against a rule without the up == 1 guard"


def test_a_rank_hung_in_a_start_up_stage_alerts_named_by_the_stage(tmp_path: Path) -> None:
    """Past its stage's deadline without progress: StormwatchRankHungInPhase{phase="mesh"};
    a peer past its own deadline that still completes collectives does not fire."""
    run = _run_case(tmp_path, "rank_hung_in_a_start_up_stage_is_named_by_the_stage_and_resolves")
    assert run.ok, run.output


def test_a_phase_excuses_a_silent_rank_only_until_its_deadline(tmp_path: Path) -> None:
    """A marked phase (checkpoint save, eval, ...) mutes the stall and hang alerts within
    its bound; without the phase clause the same inputs fire too early."""
    cases = {
        "ranks.yml": "a_phase_excuses_a_silent_rank_until_its_deadline",
        "training.yml": "training_hung_waits_for_a_phase_within_its_bound",
    }
    for file, name in cases.items():
        assert _run_case(tmp_path, name).ok
        [path] = [p for p in rule_files() if p.name == file]
        text = path.read_text()
        clause = re.search(r"\n *unless on \(training_job(, rank)?\)\n.*phase_deadline.*\n", text)
        assert clause is not None, file
        broken = tmp_path / file
        broken.write_text(text.replace(clause.group(0), "\n"))
        others = [p for p in rule_files() if p.name != file]
        run = _run_case(tmp_path, name, rules=[broken, *others])
        assert not run.ok, f"{name} passed against rules that ignore phases"


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
    assert doc == DEFAULT_RUNBOOK_BASE_URL, "absolute, on the default base"
    assert DEFAULT_RUNBOOK_BASE_URL.endswith("/docs/runbooks.md")
    assert anchor == alert["alert"].lower()
    assert anchor in _anchors(RUNBOOKS.read_text()), f"docs/runbooks.md has no section #{anchor}"


#: Metrics the rules use that agent/catalogue.csv does not list yet, with the
#: owner that will add them. Remove an entry when its catalogue row lands
#: (test_awaiting_list_only_names_missing_metrics fails until you do).
AWAITING_CATALOGUE: dict[str, str] = {}

#: Series Prometheus writes itself (per scrape target, or for alerts).
PROMETHEUS_INTERNAL = frozenset({"up", "scrape_duration_seconds", "ALERTS", "ALERTS_FOR_STATE"})
#: Series from outside the agents the rules compare them with: the expected inventory
#: (the rule file of `stormwatch alerts config inventory`) and kube-state-metrics.
EXTERNAL_INPUTS = frozenset({INVENTORY_METRIC, "kube_daemonset_status_desired_number_scheduled"})

_PROMQL_WORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "Inf", "NaN", "inf", "nan"}
)


def _metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions,
    keywords, label names (in ``{...}``, ``by (...)``, ``on (...)`` ...) or strings."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"#[^\n]*", "", text)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name in _PROMQL_WORDS:
            continue
        names.add(name)
    return names


def _catalogue_names() -> set[str]:
    from stormwatch.agent.catalogue import load_catalogue

    names = set()
    for spec in load_catalogue():
        names.add(spec.name)
        if spec.type == "histogram":
            names.update(f"{spec.name}_{suffix}" for suffix in ("sum", "count", "bucket"))
    return names


def _alert_checks() -> dict[str, list[tuple[str, float, bool]]]:
    """alertname -> [(test case, eval time in s, fires?)] over every promtool test file."""
    checks: dict[str, list[tuple[str, float, bool]]] = {}
    for path in rule_test_files():
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                at = parse_duration(str(check["eval_time"]), "eval_time")
                checks.setdefault(check["alertname"], []).append(
                    (case["name"], at, bool(check.get("exp_alerts")))
                )
    return checks


#: ``by``/``on``/``without``/``ignoring``/``group_*`` label lists of an expression.
_GROUPING = re.compile(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^()]*)\)")


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("alert") or r["record"])
def test_a_training_job_is_named_by_training_job_never_by_prometheus_job(
    rule: dict[str, Any],
) -> None:
    """``job`` is Prometheus's scrape job, ``stormwatch-agent`` on every agent series: a
    rule that grouped, matched or named a training job by it would lump all jobs into one
    (issue 19). ``job`` stays only beside the scrape job's ``up``-style series."""
    text = rule["expr"] + " ".join((rule.get("annotations") or {}).values())
    assert "$labels.job " not in text and "$labels.job}" not in text
    assert not re.match(r"job[_:]", rule.get("record", "")), rule.get("record")
    grouped = {x.strip() for group in _GROUPING.findall(rule["expr"]) for x in group.split(",")}
    if "job" in grouped:
        assert 'job="stormwatch-agent"' in rule["expr"], rule["expr"]


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_every_alert_has_a_fire_and_a_later_resolve_case(alert: dict[str, Any]) -> None:
    checks = _alert_checks().get(alert["alert"], [])
    fired = {(case, at) for case, at, fires in checks if fires}
    assert fired, f"{alert['alert']}: no promtool case where it fires"
    resolved = [
        (case, at)
        for case, at, fires in checks
        if not fires and any(c == case and t < at for c, t in fired)
    ]
    assert resolved, f"{alert['alert']}: no promtool case where it resolves after firing"


def test_every_alert_has_promtool_tests() -> None:
    assert {a["alert"] for a in _alerts()} <= set(_alert_checks())


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: str(r.get("alert") or r.get("record")))
def test_every_metric_the_rules_use_is_catalogued_recorded_or_internal(
    rule: dict[str, Any],
) -> None:
    known = (
        _catalogue_names()
        | {r["record"] for r in _rules() if "record" in r}
        | PROMETHEUS_INTERNAL
        | EXTERNAL_INPUTS
        | set(AWAITING_CATALOGUE)
    )
    unknown = _metric_names(rule["expr"]) - known
    assert not unknown, f"{rule.get('alert') or rule.get('record')} uses unknown {unknown}"


def test_awaiting_list_only_names_missing_metrics() -> None:
    """The allowlist shrinks: a metric that reached the catalogue must leave it."""
    landed = set(AWAITING_CATALOGUE) & _catalogue_names()
    assert not landed, f"now in agent/catalogue.csv, remove from AWAITING_CATALOGUE: {landed}"
    used = set().union(*(_metric_names(r["expr"]) for r in _rules()))
    assert set(AWAITING_CATALOGUE) <= used


def test_metric_name_extraction_skips_functions_labels_and_keywords() -> None:
    expr = (
        'sum by (training_job, rank) (increase(foo_total{code=~"48|79"}[5m])) '
        "> on (training_job) group_left () bar:baz:max and on (training_job) "
        "count by (training_job) (qux offset 5m) >= 2 or abs(x) == Inf\n"
        "# a comment naming words\n"
    )
    assert _metric_names(expr) == {"foo_total", "bar:baz:max", "qux", "x"}


#: Every promtool case of the rule pack (test_shipped_rules_pass_their_promtool_unit_tests
#: runs them all; the FC cases below also run alone).
PROMTOOL_CASES = {
    "agent_test.yml": ["render_slow_fires_before_the_scrape_timeout_and_resolves"],
    "nodes_test.yml": [
        "node_down_fires_three_scrapes_after_a_node_stops_answering_and_resolves",
        "agent_process_down_fires_for_a_refusing_node_without_node_down_and_resolves",
        "one_or_two_lost_scrapes_in_a_row_fire_nothing",
        "agent_flapping_fires_without_node_down_and_resolves",
        "scrape_slow_fires_and_resolves",
    ],
    "training_test.yml": [
        "one_group_failure_is_not_a_job_crash_loop",
        "issue18_three_failures_of_a_job_with_stop_markers_are_a_crash_loop",
        "training_hung_fires_after_threshold_and_resolves",
        "training_hung_waits_for_a_phase_within_its_bound",
        "issue18_training_hung_within_the_agents_threshold_plus_two_seconds",
        "issue18_minute_long_steps_are_not_a_hang",
        "issue18_a_stop_and_restart_is_not_a_hang",
        "loss_nan_fires_and_resolves",
        "checkpoint_stale_fires_and_resolves",
        "checkpoint_failing_fires_at_the_first_failed_save_even_on_a_counter_created_at_one",
        "fc14_straggler_is_named_within_seconds_and_the_waiting_ranks_are_not",
        "fc14_cpu_throttled_rank_is_named_against_its_node_peer_and_no_other_rank",
        "fc14_straggler_of_a_two_rank_job_is_named_against_its_peer",
        "fc14_one_slow_step_an_eval_pause_or_a_checkpoint_is_not_a_straggler",
        "fc14_restarted_ranks_first_slow_steps_are_not_a_straggler",
        "fc14_an_elastic_resize_is_not_a_straggler",
        "fc14_fast_steps_straggler_under_a_cpu_quota_is_named_from_the_mean_of_its_steps",
    ],
    "training_trends_test.yml": [
        "rank_crash_loop_fires_and_resolves",
        "job_crash_loop_fires_and_resolves",
        "restart_storm_fires_and_resolves",
        "restart_storm_fires_on_restarts_alternating_between_nodes",
        "throughput_drop_fires_and_resolves",
        "loss_spike_fires_and_resolves",
        "checkpoint_failing_fires_on_a_failed_save_and_resolves",
        "collective_bus_bandwidth_drop_fires_and_resolves",
        "collective_bus_bandwidth_is_judged_at_the_present_world_size",
        "fc14_minute_long_steps_alert_for_a_straggler_not_for_jitter_or_one_slow_step",
    ],
    "targets_test.yml": [
        "agent_expected_by_the_inventory_alerts_until_it_is_back_even_after_hours",
        "agent_gone_without_inventory_alerts_for_an_hour_from_memory",
        "agent_target_down_is_not_gone_from_discovery",
        "no_agent_target_at_all_fires_absent_and_resolves",
        "prometheus_restarted_without_its_data_still_alerts_for_a_gone_agent",
        "agent_away_45s_of_every_5m_fires_unavailable_and_resolves",
        "daemonset_wants_more_agents_than_discovery_returns_fires_and_resolves",
        "ranks_of_a_running_job_no_agent_shows_fire_and_resolve",
    ],
    "network_test.yml": [
        "packet_loss_names_the_node_whose_stack_drops_not_the_peer_that_retransmits",
        "a_node_that_drops_steadily_is_judged_against_its_usual_rate",
        "device_errors_name_the_node",
        "a_restarts_connection_resets_are_not_packet_loss",
        "bandwidth_throttled_names_the_node_and_its_link",
        "a_shaper_within_its_rate_is_not_a_throttled_link",
        "store_unreachable_names_the_node_that_cannot_reach_it_and_resolves",
        "store_unreachable_is_quiet_while_a_node_of_the_job_is_down",
    ],
    "gpu_test.yml": [
        "fc03_xid_fires_once_by_class_and_resolves_by_itself",
        "ecc_double_bit_fires_and_resolves",
        "row_remap_failure_fires_and_resolves",
        "fc02_lost_gpu_fires_for_that_gpu_only_and_resolves",
        "thermal_and_power_throttle_fire_by_bit_and_resolve",
        "nvlink_link_down_fires_within_three_samples_ignores_blips_and_resolves",
        "nvlink_error_rate_fires_and_resolves",
    ],
    "scrape_interval_15s_test.yml": [
        "at_15s_one_failed_scrape_fires_nothing_two_in_a_row_fire_node_down",
        "at_15s_one_refused_scrape_fires_nothing_two_in_a_row_fire_agent_process_down",
        "at_15s_nvlink_needs_two_samples_gpu_lost_xid_and_checkpoint_fire_on_the_first",
    ],
}


@pytest.mark.parametrize("file", sorted(PROMTOOL_CASES))
def test_promtool_case_table_matches_the_test_file(file: str) -> None:
    [path] = [p for p in rule_test_files() if p.name == file]
    names = [case["name"] for case in yaml.safe_load(path.read_text())["tests"]]
    assert names == PROMTOOL_CASES[file]


@pytest.mark.parametrize(
    "case",
    [
        "issue18_training_hung_within_the_agents_threshold_plus_two_seconds",
        "issue18_minute_long_steps_are_not_a_hang",
        "issue18_a_stop_and_restart_is_not_a_hang",
        "issue18_three_failures_of_a_job_with_stop_markers_are_a_crash_loop",
        "issue18_a_hang_names_the_rank_behind_in_the_collectives_not_its_waiting_peers",
        "issue18_a_stall_with_no_rank_behind_names_every_stalled_rank",
        "issue18_a_peer_failing_right_after_a_stop_request_is_its_victim",
        "issue18_the_failure_that_made_torchrun_stop_the_others_is_still_named",
        "at_15s_a_healthy_job_is_not_hung_between_scrapes_and_a_stall_still_fires",
        "issue18_ranks_waiting_for_a_node_no_agent_shows_are_not_named",
        "issue18_ranks_waiting_after_a_node_came_back_are_not_named",
        "issue18_ranks_waiting_for_peers_that_are_leaving_are_not_named",
        "issue18_a_rank_whose_agent_exports_no_threshold_gets_the_fallback",
        "issue18_a_rank_that_just_left_a_phase_is_not_stalled_while_its_heartbeat_catches_up",
    ],
)
def test_issue18_adaptive_stall_threshold_culprit_and_pauses(tmp_path: Path, case: str) -> None:
    """The agents' threshold (max(5 s, 3 x median step), warm-up 60 s) fires a hang within
    its target, not between minute-long steps nor across a stop and restart; the rank
    behind in the collectives is named, not the peers waiting for it."""
    run = _run_case(tmp_path, case)
    assert run.ok, run.output


def test_issue18_culprit_case_catches_a_rule_that_names_the_waiting_ranks(tmp_path: Path) -> None:
    """Without the collective-ahead exclusion, the waiting ranks 0 and 2 are named too:
    the culprit case fails."""
    [path] = [p for p in rule_files() if p.name == "ranks.yml"]
    text = path.read_text()
    exclusion = (
        "                  unless on (training_job, rank)\n"
        "                    training_job_rank:stormwatch_collective_ahead:bool\n"
    )
    assert exclusion in text
    broken = tmp_path / "ranks.yml"
    broken.write_text(text.replace(exclusion, ""))
    assert check_rules([broken]).ok
    run = _run_case(
        tmp_path,
        "issue18_a_hang_names_the_rank_behind_in_the_collectives_not_its_waiting_peers",
        rules=[broken],
    )
    assert not run.ok and 'rank="0"' in run.output, run.output


def test_four_restarts_in_twenty_minutes_alternating_between_nodes_raise_a_restart_storm(
    tmp_path: Path,
) -> None:
    run = _run_case(tmp_path, "restart_storm_fires_on_restarts_alternating_between_nodes")
    assert run.ok, run.output


def test_restart_storm_case_catches_a_rule_on_the_highest_node_count(tmp_path: Path) -> None:
    """The storm rule as it was (the max of the node-local counts, whose max moves by 2
    when four restarts alternate between two nodes) fails the alternating case."""
    [path] = [p for p in rule_files() if p.name == "training.yml"]
    text = path.read_text()
    job_wide = "expr: max by (training_job) (stormwatch_train_job_restarts)"
    assert job_wide in text
    broken = tmp_path / "training.yml"
    broken.write_text(
        text.replace(job_wide, "expr: max by (training_job) (stormwatch_train_node_restarts)")
    )
    assert check_rules([broken]).ok
    run = _run_case(
        tmp_path, "restart_storm_fires_on_restarts_alternating_between_nodes", rules=[broken]
    )
    assert not run.ok, "the alternating restarts fired a storm on the node-local max"


def test_one_killed_rank_is_not_a_job_crash_loop(tmp_path: Path) -> None:
    """A single failure under torchrun ends every rank: world_size exits, not a loop."""
    run = _run_case(tmp_path, "one_group_failure_is_not_a_job_crash_loop")
    assert run.ok, run.output


def test_fc14_straggler_is_named_within_seconds_and_the_waiting_ranks_are_not(
    tmp_path: Path,
) -> None:
    """The game day's slow rank: named 10 s after its first slow step, alone, and resolved
    once its steps are normal again; its TP peer computes 1.8x but waits, and is not named."""
    run = _run_case(
        tmp_path, "fc14_straggler_is_named_within_seconds_and_the_waiting_ranks_are_not"
    )
    assert run.ok, run.output


def test_fc14_cpu_throttled_rank_is_named_against_its_node_peer_and_no_other_rank(
    tmp_path: Path,
) -> None:
    """The per-step gauges the lab recorded under cpu_throttle (0.1 CPU) of rank 1: named
    against its TP peer; rank 3, which looks as slow job-wide, is not."""
    run = _run_case(
        tmp_path, "fc14_cpu_throttled_rank_is_named_against_its_node_peer_and_no_other_rank"
    )
    assert run.ok, run.output


def test_fc14_fast_steps_straggler_under_a_cpu_quota_is_named_from_the_mean_of_its_steps(
    tmp_path: Path,
) -> None:
    """20 steps a second, the scraped step of the throttled rank slow every other second:
    named from the counters' mean per step over 5 s (the gauges alone never hold 10 s)."""
    run = _run_case(
        tmp_path, "fc14_fast_steps_straggler_under_a_cpu_quota_is_named_from_the_mean_of_its_steps"
    )
    assert run.ok, run.output


def test_fc14_straggler_of_a_two_rank_job_is_named_against_its_peer(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "fc14_straggler_of_a_two_rank_job_is_named_against_its_peer")
    assert run.ok, run.output


@pytest.mark.parametrize(
    "case",
    [
        "fc14_one_slow_step_an_eval_pause_or_a_checkpoint_is_not_a_straggler",
        "fc14_restarted_ranks_first_slow_steps_are_not_a_straggler",
        "fc14_an_elastic_resize_is_not_a_straggler",
        "fc14_minute_long_steps_alert_for_a_straggler_not_for_jitter_or_one_slow_step",
    ],
)
def test_fc14_straggler_does_not_fire_on_one_slow_step_a_warm_up_or_slow_steady_steps(
    tmp_path: Path, case: str
) -> None:
    run = _run_case(tmp_path, case)
    assert run.ok, run.output


def test_fc14_straggler_cases_catch_a_rule_without_its_step_and_warm_up_clauses(
    tmp_path: Path,
) -> None:
    """The cases have teeth: without the 3-steps clause one slow step fires, without the
    warm-up clause (the rank reported at the window's start) a restart's first steps fire."""
    [path] = [p for p in rule_files() if p.name == "training.yml"]
    text = path.read_text()
    steps = re.compile(r"(changes\(stormwatch_train_step\[\w+\]\)\)) >= 2")
    warm_up = re.compile(
        r"\n *and training_job_rank_node:stormwatch_train_straggler_step:bool offset \w+"
    )
    assert len(steps.findall(text)) == 4 and len(warm_up.findall(text)) == 4
    others = [p for p in rule_files() if p.name != "training.yml"]
    broken = tmp_path / "training.yml"
    for pattern, replacement, case in (
        (steps, r"\1 >= 0", "fc14_one_slow_step_an_eval_pause_or_a_checkpoint_is_not_a_straggler"),
        (warm_up, "", "fc14_restarted_ranks_first_slow_steps_are_not_a_straggler"),
    ):
        broken.write_text(pattern.sub(replacement, text))
        assert check_rules([broken]).ok
        run = _run_case(tmp_path, case, rules=[broken, *others])
        assert not run.ok, f"{case} passed against a rule without the clause"


def test_fc02_lost_gpu_alerts_for_that_gpu_only(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "fc02_lost_gpu_fires_for_that_gpu_only_and_resolves")
    assert run.ok, run.output


def test_fc03_xid_alert_fires_once_and_resolves_by_itself(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "fc03_xid_fires_once_by_class_and_resolves_by_itself")
    assert run.ok, run.output


def test_fc03_xid_case_catches_a_rule_blind_to_counters_created_at_one(tmp_path: Path) -> None:
    """Without the ``unless ... offset`` branch XID 31 (series born at 1) never fires."""
    [path] = [p for p in rule_files() if p.name == "gpu.yml"]
    text = path.read_text()
    branch = (
        "          or\n          sum by (node, gpu, code) (\n"
        "            stormwatch_gpu_xid_errors_total > 0\n"
        "            unless stormwatch_gpu_xid_errors_total offset 5m\n          )\n"
    )
    assert branch in text
    broken = tmp_path / "gpu.yml"
    broken.write_text(text.replace(branch, "\n"))
    run = _run_case(tmp_path, "fc03_xid_fires_once_by_class_and_resolves_by_itself", [broken])
    assert not run.ok


# -- issue 18: every fault class detected in seconds, without false alarms -----------------


#: The `for` line of the fast alerts (the rule files' comments mention `for: 2s` too).
_FOR_2S = "        for: 2s\n"


def _rewritten(tmp_path: Path, name: str, old: str, new: str, count: int = 1) -> Path:
    """The shipped rule file ``name`` with ``old`` (found ``count`` times) replaced by ``new``."""
    [path] = [p for p in rule_files() if p.name == name]
    text = path.read_text()
    assert text.count(old) == count, (name, old)
    folder = tmp_path / f"rewritten-{len(list(tmp_path.glob('rewritten-*')))}"
    folder.mkdir()
    out = folder / name
    out.write_text(text.replace(old, new))
    assert check_rules([out]).ok
    return out


def test_a_node_that_stops_answering_fires_node_down_within_three_scrapes(tmp_path: Path) -> None:
    """Timed-out scrapes from t=61: StormwatchNodeDown at t=63 (the lab: 3-5 s after the cut,
    counting the 1 s timeout and the evaluation's phase), not the agent alert; resolves."""
    assert _run_case(
        tmp_path, "node_down_fires_three_scrapes_after_a_node_stops_answering_and_resolves"
    ).ok


def test_a_dead_agent_on_a_live_node_is_named_agent_process_down_not_node_down(
    tmp_path: Path,
) -> None:
    run = _run_case(
        tmp_path, "agent_process_down_fires_for_a_refusing_node_without_node_down_and_resolves"
    )
    assert run.ok, run.output


def test_one_or_two_lost_scrapes_in_a_row_never_fire_a_node_alert(tmp_path: Path) -> None:
    run = _run_case(tmp_path, "one_or_two_lost_scrapes_in_a_row_fire_nothing")
    assert run.ok, run.output


def test_node_cases_catch_a_for_too_short_or_as_long_as_before(tmp_path: Path) -> None:
    """The cases have teeth: `for: 1s` (two evaluations) fires on two lost scrapes; the
    `for: 1m` of before misses the 5 s target."""
    quick = _rewritten(tmp_path, "nodes.yml", _FOR_2S, "        for: 1s\n", count=2)
    run = _run_case(tmp_path, "one_or_two_lost_scrapes_in_a_row_fire_nothing", rules=[quick])
    assert not run.ok, "two lost scrapes in a row fired nothing with for: 1s"
    slow = _rewritten(tmp_path, "nodes.yml", _FOR_2S, "        for: 1m\n", count=2)
    for name in (
        "node_down_fires_three_scrapes_after_a_node_stops_answering_and_resolves",
        "agent_process_down_fires_for_a_refusing_node_without_node_down_and_resolves",
    ):
        assert not _run_case(tmp_path, name, rules=[slow]).ok, name


def test_nvlink_down_fires_within_three_samples_and_ignores_blips(tmp_path: Path) -> None:
    name = "nvlink_link_down_fires_within_three_samples_ignores_blips_and_resolves"
    assert _run_case(tmp_path, name).ok
    for changed in ("for: 1s", "for: 1m"):
        broken = _rewritten(tmp_path, "gpu.yml", _FOR_2S, f"        {changed}\n")
        assert not _run_case(tmp_path, name, rules=[broken]).ok, changed


def test_checkpoint_failing_fires_at_the_first_failed_save_of_a_counter_created_at_one(
    tmp_path: Path,
) -> None:
    """Without the ``unless ... offset`` branch (the rule as it was) a job whose failure
    counter is created at its first failure is alerted only at its second."""
    name = "checkpoint_failing_fires_at_the_first_failed_save_even_on_a_counter_created_at_one"
    assert _run_case(tmp_path, name).ok
    [path] = [p for p in rule_files() if p.name == "training.yml"]
    branch = re.search(
        r"\n +or\n +\(\n +stormwatch_train_checkpoint_failures_total > 0\n.*offset 15m\n +\)",
        path.read_text(),
    )
    assert branch is not None
    broken = _rewritten(tmp_path, "training.yml", branch.group(0), "")
    ranks = [p for p in rule_files() if p.name == "ranks.yml"]
    assert not _run_case(tmp_path, name, rules=[*ranks, broken]).ok


_AT_15S = [
    "at_15s_one_failed_scrape_fires_nothing_two_in_a_row_fire_node_down",
    "at_15s_one_refused_scrape_fires_nothing_two_in_a_row_fire_agent_process_down",
    "at_15s_nvlink_needs_two_samples_gpu_lost_xid_and_checkpoint_fire_on_the_first",
]


@pytest.mark.parametrize("name", _AT_15S)
def test_the_shipped_fast_alerts_at_a_15s_scrape_never_fire_on_one_lost_sample(
    tmp_path: Path, name: str
) -> None:
    run = _run_case(tmp_path, name)
    assert run.ok, run.output


def test_scaled_to_a_15s_scrape_node_down_waits_for_three_failed_scrapes(tmp_path: Path) -> None:
    """docs/runbooks.md, "Scrape intervals": `for` = 2x the evaluation interval. With
    `for: 30s` at a 15 s scrape and evaluation, two failed scrapes in a row fire nothing and
    three fire StormwatchNodeDown (detection 30-60 s + the timeout instead of 2-4 s)."""
    scaled = _rewritten(tmp_path, "nodes.yml", _FOR_2S, "        for: 30s\n", count=2)
    [rule] = [a for a in _alerts() if a["alert"] == "StormwatchNodeDown"]
    annotations = {
        key: " ".join(value.split())
        .replace("{{ $labels.node }}", "node1")
        .replace("{{ $labels.instance }}", "n1:9400")
        for key, value in rule["annotations"].items()
    }
    case = {
        "rule_files": [str(scaled)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "name": "scaled_node_down_at_15s",
                "interval": "15s",
                "input_series": [
                    {
                        "series": 'up{job="stormwatch-agent",node="node1",instance="n1:9400"}',
                        "values": "1x8 0 0 1x8 0x5 1x4",
                    },
                    {
                        "series": 'scrape_duration_seconds{job="stormwatch-agent",node="node1",'
                        'instance="n1:9400"}',
                        "values": "0.01x8 10 10 0.01x8 10x5 0.01x4",
                    },
                ],
                "alert_rule_test": [
                    *(
                        {"eval_time": at, "alertname": "StormwatchNodeDown", "exp_alerts": []}
                        for at in ("135s", "150s", "165s", "300s", "315s")
                    ),
                    {
                        "eval_time": "330s",
                        "alertname": "StormwatchNodeDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "job": "stormwatch-agent",
                                    "node": "node1",
                                    "instance": "n1:9400",
                                },
                                "exp_annotations": annotations,
                            }
                        ],
                    },
                ],
            }
        ],
    }
    document = tmp_path / "scaled_test.yml"
    document.write_text(yaml.safe_dump(case, sort_keys=False))
    run = run_rule_tests([document])
    assert run.ok, run.output


def test_the_playbook_alert_is_a_shipped_alert() -> None:
    assert RANK_STALLED in {a["alert"] for a in _alerts()}


# -- targets against the expected inventory (targets.yml) ------------------------------

_TARGET_CASES = {
    "vanish": "agent_expected_by_the_inventory_alerts_until_it_is_back_even_after_hours",
    "flap": "agent_away_45s_of_every_5m_fires_unavailable_and_resolves",
    "restart": "prometheus_restarted_without_its_data_still_alerts_for_a_gone_agent",
}


def test_agent_gone_from_discovery_alerts_until_it_is_back_however_long(tmp_path: Path) -> None:
    run = _run_case(tmp_path, _TARGET_CASES["vanish"])
    assert run.ok, run.output


def test_agent_away_45s_of_every_5m_fires_the_availability_alert(tmp_path: Path) -> None:
    run = _run_case(tmp_path, _TARGET_CASES["flap"])
    assert run.ok, run.output


def test_prometheus_restarted_without_its_data_still_alerts_for_a_gone_agent(
    tmp_path: Path,
) -> None:
    run = _run_case(tmp_path, _TARGET_CASES["restart"])
    assert run.ok, run.output


def test_target_cases_catch_rules_that_ignore_the_inventory(tmp_path: Path) -> None:
    """Without the inventory (what the rules were before), the vanish, flap and restart
    cases fail: the alert ended an hour after the target left, a target away 45 s of
    every 5 m fired nothing, a restart without data forgot the gone target."""
    [path] = [p for p in rule_files() if p.name == "targets.yml"]
    text = path.read_text()
    branch = (
        "            max by (node) (stormwatch_inventory_agent_expected)\n"
        '            unless on (node) up{job="stormwatch-agent"}\n'
    )
    expected = "          0 * max by (node) (stormwatch_inventory_agent_expected)\n"
    assert branch in text and expected in text
    broken = tmp_path / "targets.yml"
    broken.write_text(
        text.replace(branch, "            absent(nothing_at_all)\n").replace(
            expected, "          absent(nothing_at_all)\n"
        )
    )
    assert check_rules([broken]).ok
    for name in _TARGET_CASES.values():
        run = _run_case(tmp_path, name, rules=[broken])
        assert not run.ok, f"{name} passed against rules without the inventory"


def test_runbook_urls_follow_a_configured_base(tmp_path: Path) -> None:
    base = "https://wiki.example/sre/stormwatch-runbooks"
    groups = rule_groups(base)
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    assert len(alerts) == len(_alerts())
    assert all(a["annotations"]["runbook_url"] == f"{base}#{a['alert'].lower()}" for a in alerts)
    written = write_rule_files(tmp_path / "rules", base)
    assert [p.name for p in written] == [p.name for p in rule_files()]
    reread = [g for p in written for g in yaml.safe_load(p.read_text())["groups"]]
    assert reread == groups, "the written files hold what rule_groups gives"
    assert check_rules(written).ok


def test_render_rules_reads_the_environment_and_refuses_a_relative_base(tmp_path: Path) -> None:
    from click.testing import CliRunner

    out = tmp_path / "rules"
    env = {"STORMWATCH_RUNBOOK_BASE_URL": "https://docs.example/runbooks"}
    done = CliRunner().invoke(render_rules_cmd, ["--out", str(out)], env=env)
    assert done.exit_code == 0, done.output
    assert "https://docs.example/runbooks#stormwatchgpulost" in (out / "gpu.yml").read_text()
    with pytest.raises(ConfigError, match="absolute"):
        rule_groups("docs/runbooks.md")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ConfigError):
        write_rule_files(tmp_path / "bad", "runbooks.md")
    assert not (tmp_path / "bad").exists()


def test_render_rules_names_an_unwritable_out_folder_instead_of_a_traceback(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(
        ConfigError, match=r"^--out: cannot write .*a-file/rules: .*writable folder"
    ):
        write_rule_files(blocker / "rules", "https://x/y")


def test_packet_loss_names_the_node_whose_stack_drops_not_the_peer_that_retransmits(
    tmp_path: Path,
) -> None:
    """The lab's packet_drop on node1: node1 named within 20 s, not node0, which retransmits
    for it; resolved a minute after the loss ends."""
    run = _run_case(
        tmp_path, "packet_loss_names_the_node_whose_stack_drops_not_the_peer_that_retransmits"
    )
    assert run.ok, run.output


@pytest.mark.parametrize(
    "case",
    [
        "device_errors_name_the_node",
        "a_restarts_connection_resets_are_not_packet_loss",
        "bandwidth_throttled_names_the_node_and_its_link",
        "a_shaper_within_its_rate_is_not_a_throttled_link",
    ],
)
def test_node_network_alerts_name_the_faulted_node_and_nothing_else(
    tmp_path: Path, case: str
) -> None:
    run = _run_case(tmp_path, case)
    assert run.ok, run.output
