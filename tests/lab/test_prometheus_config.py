"""The lab's generated Prometheus and Alertmanager configuration."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from stormwatch.alerts.policy import load_policy
from stormwatch.dashboards import build_all
from stormwatch.durations import parse_duration
from stormwatch.lab import LabConfig
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.services.definitions import (
    AGENT_SCRAPE_JOB,
    ALERT_FOR_GRACE_PERIOD,
    agent_spec,
    check_prometheus_config,
    go_duration,
    grafana_hint,
    lab_policy_path,
    prometheus_spec,
    responder_spec,
    rules_dir,
    stormwatch_command,
    write_alertmanager_config,
    write_grafana_files,
    write_inventory,
    write_prometheus_config,
)
from stormwatch.lab.state import plan_state


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="needs promtool (apt-get install prometheus)"
)
def test_generated_prometheus_config_passes_promtool_with_shipped_rules(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    state = plan_state(paths, LabConfig())
    rules = rules_dir()
    assert list(rules.glob("*.yml")), "stormwatch alerts ships no rule files"
    inventory = write_inventory(state, paths)
    path = write_prometheus_config(state, paths, rules, inventory)
    assert yaml.safe_load(path.read_text())["rule_files"] == [f"{rules}/*.yml", str(inventory)]
    out = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
    check_prometheus_config(path)  # the lab's own check agrees


def test_prometheus_scrapes_every_agent_with_its_node_label(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    config = LabConfig(nodes=3, subnet="10.50.0.0/24", alertmanager_port=29093)
    state = plan_state(paths, config)
    document = yaml.safe_load(write_prometheus_config(state, paths, Path("/rules")).read_text())
    assert document["global"] == {
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "evaluation_interval": "1s",
    }
    assert document["rule_files"] == ["/rules/*.yml"]
    assert document["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "127.0.0.1:29093"
    ]
    [agents] = [j for j in document["scrape_configs"] if j["job_name"] == AGENT_SCRAPE_JOB]
    # The series name their training job in `training_job`: `job` is the scrape job's, and
    # the scrape needs no honor_labels (issue 19: a Prometheus Operator may override it).
    assert "honor_labels" not in agents
    assert agents["static_configs"] == [
        {"targets": [f"10.50.0.{10 + i}:9400"], "labels": {"node": f"node{i}"}} for i in range(3)
    ]


def test_prometheus_command_listens_on_loopback_with_lifecycle(tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("needs the prometheus binary")
    paths = RunPaths.of(tmp_path)
    config = LabConfig()
    cmd = prometheus_spec(config, plan_state(paths, config), paths).cmd
    assert "--web.listen-address=127.0.0.1:19090" in cmd
    assert "--web.enable-lifecycle" in cmd
    assert f"--storage.tsdb.path={paths.prometheus_data}" in cmd


@pytest.mark.skipif(shutil.which("amtool") is None, reason="needs amtool (prometheus-alertmanager)")
def test_generated_alertmanager_config_is_valid_and_waits_briefly(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    state = plan_state(paths, LabConfig(alert_group_wait=0.5))
    state.responder_token_file.parent.mkdir(parents=True)
    state.responder_token_file.write_text("secret\n")
    path = write_alertmanager_config(state, paths)
    out = subprocess.run(
        ["amtool", "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    route = yaml.safe_load(path.read_text())["route"]
    assert route["group_wait"] == "500ms"


@pytest.mark.parametrize(
    ("seconds", "text"), [(1.0, "1s"), (0.5, "500ms"), (2.25, "2250ms"), (60, "60s")]
)
def test_durations_are_written_the_go_way(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_lab_agents_do_not_claim_other_jobs_unlabelled_ranks(tmp_path: Path) -> None:
    """Lab agents share the host's PID namespace: each must watch only its own node's ranks."""
    paths = RunPaths.of(tmp_path)
    state = plan_state(paths, LabConfig())
    specs = [agent_spec(state.config, node, state, paths) for node in state.nodes]
    assert all("--no-claim-unlabelled-ranks" in spec.cmd for spec in specs)
    help_text = subprocess.run(
        [*stormwatch_command(), "agent", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "--no-claim-unlabelled-ranks" in help_text.replace("--no-\n", "--no-").replace(" ", "")


def test_grafana_files_point_at_the_labs_prometheus(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path / "run")
    state = plan_state(paths, LabConfig(prometheus_port=19990))
    folder = write_grafana_files(state, paths)

    assert folder == paths.grafana_dir == tmp_path / "run" / "grafana"
    uids = {p.stem for p in (folder / "dashboards").glob("*.json")}
    assert uids == set(build_all())
    datasources = yaml.safe_load((folder / "provisioning/datasources/stormwatch.yaml").read_text())
    [source] = datasources["datasources"]
    assert source["url"] == state.prometheus_url == "http://127.0.0.1:19990"
    # The lab's fast value over the production default.
    assert source["jsonData"] == {"timeInterval": "1s"} and source["isDefault"] is False
    providers = yaml.safe_load((folder / "provisioning/dashboards/stormwatch.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == str(folder / "dashboards")
    hint = grafana_hint(folder)
    assert "\n" not in hint and f"GF_PATHS_PROVISIONING={folder / 'provisioning'}" in hint


def test_the_responder_gets_the_labs_policy_unless_the_run_has_its_own(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    state = plan_state(paths, LabConfig())
    command = list(responder_spec(LabConfig(), state, paths).cmd)
    shipped = load_policy(Path(command[command.index("--policy") + 1]))
    assert command[command.index("--policy") + 1] == str(lab_policy_path())
    assert {rule.alertname: rule.actions for rule in shipped.rules} == {
        "StormwatchRankStalled": ("confirm_restart",),
        "StormwatchTrainingHung": ("restart_workers",),
    }
    own = paths.responder_dir / "policy.yml"
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text("rules: []\n", encoding="utf-8")
    command = list(responder_spec(LabConfig(), state, paths).cmd)
    assert command[command.index("--policy") + 1] == str(own)


def test_the_responder_acts_with_the_labs_target_file(tmp_path: Path) -> None:
    """``alerts serve --target <run>/target.yaml``: the platform (Slurm on the Slurm lab),
    its Prometheus and the lab's run directory all come from the file ``lab up`` wrote."""
    paths = RunPaths.of(tmp_path)
    state = plan_state(paths, LabConfig())
    command = list(responder_spec(LabConfig(), state, paths).cmd)
    assert command[command.index("--target") + 1] == str(paths.target_file)
    assert "--lab-run-dir" not in command and "--platform" not in command
    assert "--prometheus-url" not in command  # the target file's


def test_lab_inventory_expects_an_agent_on_every_node(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    state = plan_state(paths, LabConfig(nodes=3))
    document = yaml.safe_load(write_inventory(state, paths).read_text())
    [group] = document["groups"]
    assert [(r["record"], r["expr"], r["labels"]) for r in group["rules"]] == [
        ("stormwatch_inventory_agent_expected", "vector(1)", {"node": f"node{i}"}) for i in range(3)
    ]


def test_alert_state_of_every_shipped_rule_survives_a_prometheus_restart(tmp_path: Path) -> None:
    """Prometheus restores an alert's `for` state after a restart only when the `for` is at
    least --rules.alert.for-grace-period. Every shipped `for` is either that long (restored)
    or seconds (issue 18's fast alerts, at most 10 s: the network alerts' hold; pending again
    and firing within their `for` after the restart, nothing to restore)."""
    if shutil.which("prometheus") is None:
        pytest.skip("needs the prometheus binary")
    fors = [
        parse_duration(rule["for"], "for")
        for path in rules_dir().glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "for" in rule
    ]
    grace = parse_duration(ALERT_FOR_GRACE_PERIOD, "grace")
    assert all(f >= grace or f <= 10 for f in fors), sorted(fors)
    assert any(f >= grace for f in fors)
    paths = RunPaths.of(tmp_path)
    config = LabConfig()
    cmd = prometheus_spec(config, plan_state(paths, config), paths).cmd
    assert f"--rules.alert.for-grace-period={ALERT_FOR_GRACE_PERIOD}" in cmd
