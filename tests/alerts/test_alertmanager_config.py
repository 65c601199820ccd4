"""Generated alertmanager.yml: structure, validation, and `amtool check-config` (real amtool)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormwatch.alerts import (
    AlertmanagerSettings,
    build_alertmanager_config,
    render_alertmanager_config,
    write_alertmanager_config,
)
from stormwatch.alerts.rulefiles import run_tool
from stormwatch.durations import format_duration, parse_duration
from stormwatch.errors import ConfigError


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "responder.token"
    path.write_text("s3cret\n")
    path.chmod(0o600)
    return path


def _amtool_ok(path: Path) -> None:
    run = run_tool(["amtool", "check-config", str(path)])
    assert run.ok, run.output
    assert "SUCCESS" in run.output


def test_config_routes_to_the_responder_with_bearer_auth_and_resolved(token: Path) -> None:
    settings = AlertmanagerSettings(responder_url="http://127.0.0.1:19095", token_file=token)
    doc = yaml.safe_load(render_alertmanager_config(settings))
    route = doc["route"]
    assert route["group_by"] == ["alertname", "training_job"]
    # Production defaults: Alertmanager's own (the lab passes its fast values).
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == (
        "30s",
        "5m",
        "4h",
    )
    receivers = doc["receivers"]
    assert [r["name"] for r in receivers] == [
        "stormwatch-responder",
        "stormwatch-responder-critical",
        "stormwatch-responder-warning",
    ]
    assert route["receiver"] == "stormwatch-responder"
    for receiver in receivers:
        [webhook] = receiver["webhook_configs"]
        assert webhook["url"] == "http://127.0.0.1:19095/v1/alertmanager"
        assert webhook["send_resolved"] is True
        # Bounded so a huge group fits the responder's body limit instead of a 413 loop.
        assert 0 < webhook["max_alerts"] <= 1000
        assert webhook["http_config"]["authorization"] == {
            "type": "Bearer",
            "credentials_file": str(token.resolve()),
        }


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"group_wait_s": 0.5, "group_interval_s": 1.0, "repeat_interval_s": 90.0},
        {"group_wait_s": 30.0, "group_interval_s": 300.0, "repeat_interval_s": 14400.0},
    ],
    ids=["defaults", "fast-lab", "upstream-defaults"],
)
def test_generated_config_passes_amtool_check_config(
    tmp_path: Path, token: Path, kwargs: dict[str, Any]
) -> None:
    settings = AlertmanagerSettings(
        responder_url="http://127.0.0.1:19095", token_file=token, **kwargs
    )
    path = write_alertmanager_config(settings, tmp_path / "alertmanager.yml")
    _amtool_ok(path)


def test_full_webhook_url_is_kept_as_is(token: Path) -> None:
    settings = AlertmanagerSettings(
        responder_url="http://127.0.0.1:19095/v1/alertmanager/", token_file=token
    )
    config = build_alertmanager_config(settings)
    assert config.receivers[0].webhook_configs[0].url == "http://127.0.0.1:19095/v1/alertmanager"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"responder_url": "127.0.0.1:19095"}, "responder_url"),
        ({"responder_url": "ftp://host/x"}, "responder_url"),
        ({"responder_url": "http://h:1/?a=b"}, "responder_url"),
        ({"responder_url": "http://127.0.0.1:1\n  evil: yes"}, "responder_url"),
        ({"token_file": Path("/nonexistent/token")}, "token_file"),
        ({"group_wait_s": 0.0}, "group_wait_s"),
        ({"group_by": ()}, "group_by"),
        ({"node_group_by": ("",)}, "node_group_by"),
    ],
)
def test_bad_settings_name_the_field(token: Path, kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {
        "responder_url": "http://127.0.0.1:19095",
        "token_file": token,
        **kwargs,
    }
    with pytest.raises(ConfigError, match=field):
        AlertmanagerSettings(**args)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("4h", 14400.0),
        ("1d", 86400.0),
        ("1h1ms", 3600.001),
    ],
)
def test_durations_round_trip(text: str, seconds: float) -> None:
    assert parse_duration(text, "x") == pytest.approx(seconds)
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["", "1", "1.5s", "s", "1x", "1s1m", "-1s"])
def test_bad_duration_names_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="--group-wait"):
        parse_duration(text, "--group-wait")


def test_cli_prints_and_writes_a_config_amtool_accepts(
    kit: Any, tmp_path: Path, token: Path
) -> None:
    base = [
        kit.stormwatch,
        "alerts",
        "config",
        "alertmanager",
        "--responder-url",
        "http://127.0.0.1:19095",
        "--token-file",
        str(token),
    ]
    printed = subprocess.run(base, capture_output=True, text=True, timeout=60, check=True).stdout
    out = tmp_path / "am.yml"
    subprocess.run(
        [*base, "--group-wait", "2s", "-o", str(out)], capture_output=True, timeout=60, check=True
    )
    assert yaml.safe_load(out.read_text())["route"]["group_wait"] == "2s"
    assert yaml.safe_load(printed)["route"]["group_wait"] == "30s"
    _amtool_ok(out)


def test_cli_user_error_exits_2_without_traceback(kit: Any, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            kit.stormwatch,
            "alerts",
            "config",
            "alertmanager",
            "--responder-url",
            "http://127.0.0.1:19095",
            "--token-file",
            str(tmp_path / "missing.token"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "token_file" in out.stderr and "Traceback" not in out.stderr


# Table: labels of an alert -> the receiver it must reach, and the route (shown
# by `amtool config routes test --tree`) that must match it.
ROUTING_CASES = [
    pytest.param(
        {
            "alertname": "StormwatchRankStalled",
            "severity": "critical",
            "training_job": "j",
            "rank": "1",
        },
        "stormwatch-responder",
        'alertname=~"StormwatchRankStalled"',
        id="rank-stalled-goes-to-the-remediation-route",
    ),
    pytest.param(
        {"alertname": "StormwatchGpuLost", "severity": "critical", "node": "n0", "gpu": "3"},
        "stormwatch-responder-critical",
        'StormwatchNodeBandwidthThrottled",severity="critical"',
        id="critical-node-alert-grouped-by-node",
    ),
    pytest.param(
        {"alertname": "StormwatchNodeDown", "severity": "critical", "node": "n0"},
        "stormwatch-responder-critical",
        'StormwatchNodeBandwidthThrottled",severity="critical"',
        id="node-down-grouped-by-node",
    ),
    pytest.param(
        {"alertname": "StormwatchGpuThermalThrottle", "severity": "warning", "node": "n0"},
        "stormwatch-responder-warning",
        'StormwatchNodeBandwidthThrottled",severity="warning"',
        id="warning-node-alert-grouped-by-node",
    ),
    pytest.param(
        {"alertname": "StormwatchAgentUnavailable", "severity": "warning", "node": "n0"},
        "stormwatch-responder-warning",
        'StormwatchNodeBandwidthThrottled",severity="warning"',
        id="flapping-agent-grouped-by-node",
    ),
    pytest.param(
        {"alertname": "StormwatchNodePacketLoss", "severity": "warning", "node": "n1"},
        "stormwatch-responder-warning",
        'StormwatchNodeBandwidthThrottled",severity="warning"',
        id="lossy-node-grouped-by-node",
    ),
    pytest.param(
        {"alertname": "StormwatchTrainingHung", "severity": "critical", "training_job": "j"},
        "stormwatch-responder-critical",
        '{severity="critical"}',
        id="critical-job-alert",
    ),
    pytest.param(
        {"alertname": "StormwatchThroughputDrop", "severity": "warning", "training_job": "j"},
        "stormwatch-responder-warning",
        '{severity="warning"}',
        id="warning-job-alert",
    ),
    pytest.param(
        {"alertname": "SomethingElse", "severity": "info"},
        "stormwatch-responder",
        "default-route",
        id="unmatched-stays-on-the-root",
    ),
]


@pytest.fixture
def generated(tmp_path: Path, token: Path) -> Path:
    settings = AlertmanagerSettings(responder_url="http://127.0.0.1:19095", token_file=token)
    return write_alertmanager_config(settings, tmp_path / "alertmanager.yml")


@pytest.mark.parametrize(("labels", "receiver", "route"), ROUTING_CASES)
def test_amtool_routes_test_sends_each_alert_to_its_receiver(
    generated: Path, labels: dict[str, str], receiver: str, route: str
) -> None:
    pairs = [f"{k}={v}" for k, v in labels.items()]
    run = run_tool(
        [
            "amtool",
            "config",
            "routes",
            "test",
            f"--config.file={generated}",
            f"--verify.receivers={receiver}",
            "--tree",
            *pairs,
        ]
    )
    assert run.ok, run.output
    tree = run.output.split("Matching routes:")[1].splitlines()
    matched = [line for line in tree if "\u2500\u2500" in line][-1]  # deepest "└──" node
    assert route in matched, run.output


def test_node_scoped_routes_group_by_node_and_job_routes_by_job(generated: Path) -> None:
    routes = yaml.safe_load(generated.read_text())["route"]["routes"]
    by_receiver_and_group = [(r["receiver"], r.get("group_by")) for r in routes]
    assert by_receiver_and_group == [
        ("stormwatch-responder", None),
        ("stormwatch-responder-critical", ["alertname", "node"]),
        ("stormwatch-responder-warning", ["alertname", "node"]),
        ("stormwatch-responder-critical", None),
        ("stormwatch-responder-warning", None),
    ]
    assert all(not r.get("continue") for r in routes)


def test_inhibitions_mute_a_down_nodes_alerts_and_a_lost_gpus_other_alerts(generated: Path) -> None:
    rules = yaml.safe_load(generated.read_text())["inhibit_rules"]
    by_source = {tuple(r["source_matchers"]): r for r in rules}
    node_down = by_source[('alertname="StormwatchNodeDown"',)]
    assert node_down["equal"] == ["node"]
    gpu_lost = by_source[('alertname="StormwatchGpuLost"',)]
    assert gpu_lost["equal"] == ["node", "gpu"]
    assert 'alertname!="StormwatchGpuLost"' in gpu_lost["target_matchers"]


def test_a_training_jobs_inhibitions_match_on_its_training_job_not_the_scrape_job(
    generated: Path,
) -> None:
    """Every agent's alert carries ``job="stormwatch-agent"``: equal on ``job``, one training
    job's hang would mute every other job's throughput drop (issue 19)."""
    rules = yaml.safe_load(generated.read_text())["inhibit_rules"]
    by_source = {tuple(r["source_matchers"]): r for r in rules}
    for source in ('alertname="StormwatchTrainingHung"', 'alertname="StormwatchLossNaN"'):
        assert by_source[(source,)]["equal"] == ["training_job"], source


def test_an_agent_gone_from_discovery_mutes_its_unavailability(generated: Path) -> None:
    rules = yaml.safe_load(generated.read_text())["inhibit_rules"]
    [rule] = [r for r in rules if r["source_matchers"] == ['alertname="StormwatchAgentDown"']]
    assert rule["target_matchers"] == ['alertname="StormwatchAgentUnavailable"']
    assert rule["equal"] == ["node"]
