"""``lab up`` / ``status`` / ``down`` with real namespaces, agents, Prometheus, Alertmanager and
responder: healthy when up, and nothing left behind afterwards, however ``up`` ended."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stormwatch.clients import PrometheusClient
from stormwatch.lab import (
    Lab,
    LabConfig,
    ProgressEvent,
    ServiceFailedError,
)
from stormwatch.lab.netns import IpRoute2
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import StateStore

pytestmark = [pytest.mark.e2e, pytest.mark.root]

Leftovers = Callable[[LabConfig, Path], list[str]]


def _popen_up(run_dir: Path, args: list[str]) -> subprocess.Popen[str]:
    stormwatch = str(Path(sys.executable).with_name("stormwatch"))
    return subprocess.Popen(
        [stormwatch, "lab", "up", "--run-dir", str(run_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_started_services(run_dir: Path, config: LabConfig, count: int) -> None:
    """Until ``lab up`` has created the namespaces and recorded ``count`` processes."""
    store = StateStore(RunPaths.of(run_dir))
    network = IpRoute2()
    deadline = time.monotonic() + 60
    while True:
        state = store.load()
        namespaces = [n for n in network.namespaces() if config.owns_netns(n)]
        if state is not None and len(namespaces) == config.nodes and len(state.processes) >= count:
            return
        assert time.monotonic() < deadline, "lab up did not get far enough"
        time.sleep(0.05)


def test_up_is_healthy_and_down_leaves_nothing(
    tmp_path: Path,
    lab_config: LabConfig,
    run_cli: Callable[..., subprocess.CompletedProcess[str]],
    config_args: Callable[[LabConfig], list[str]],
    nothing_left: Leftovers,
    cleanup_lab: Callable[[LabConfig, Path], None],
) -> None:
    cleanup_lab(lab_config, tmp_path)
    up = run_cli("lab", "up", "--run-dir", str(tmp_path), *config_args(lab_config))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "prometheus is healthy" in up.stderr and "lab up" in up.stderr

    status = run_cli("lab", "status", "--run-dir", str(tmp_path), "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert report["phase"] == "up" and report["healthy"] is True
    # Issue 15: three nodes by default (a two-node job and a spare), Slurm over them.
    assert [n["name"] for n in report["nodes"]] == ["node0", "node1", "node2"]
    assert report["slurm"]["healthy"] is True
    assert all(n["netns_exists"] and n["agent"]["healthy"] for n in report["nodes"])
    assert {s["name"] for s in report["services"]} == {"prometheus", "alertmanager", "responder"}

    state = Lab(tmp_path).state
    assert [str(n.address) for n in state.nodes] == [
        str(lab_config.node_address(0)),
        str(lab_config.node_address(1)),
        str(lab_config.node_address(2)),
    ]
    # Grafana dashboards and provisioning for this lab's Prometheus, and how to use them.
    grafana = RunPaths.of(tmp_path).grafana_dir
    assert (grafana / "dashboards" / "stormwatch-training.json").is_file()
    datasources = (grafana / "provisioning" / "datasources" / "stormwatch.yaml").read_text()
    assert f"url: {state.prometheus_url}" in datasources
    assert (grafana / "provisioning" / "dashboards" / "stormwatch.yaml").is_file()
    assert f"GF_PATHS_PROVISIONING={grafana / 'provisioning'}" in up.stderr
    for token in (state.agent_token_file, state.responder_token_file):
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        assert len(token.read_text().strip()) >= 32
    # Prometheus scrapes every agent (through the bridge) and labels them by node.
    up_samples = PrometheusClient(state.prometheus_url).query('up{job="stormwatch-agent"}')
    by_node = {s.labels["node"]: s.value for s in up_samples}
    assert by_node == {"node0": 1.0, "node1": 1.0, "node2": 1.0}

    again = run_cli("lab", "up", "--run-dir", str(tmp_path), *config_args(lab_config))
    assert again.returncode == 0 and "already up" in again.stderr
    assert Lab(tmp_path).state.processes == state.processes

    human = run_cli("lab", "status", "--run-dir", str(tmp_path))
    assert "healthy" in human.stdout and "node1" in human.stdout

    # A dead service makes the lab unhealthy, and status says which one.
    os.kill(state.processes["responder"].pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        report = json.loads(run_cli("lab", "status", "--run-dir", str(tmp_path), "--json").stdout)
        [responder] = [s for s in report["services"] if s["name"] == "responder"]
        if not responder["running"]:
            break
        assert time.monotonic() < deadline, responder
        time.sleep(0.2)
    assert report["healthy"] is False and responder["healthy"] is False
    assert responder["returncode"] == -signal.SIGKILL

    down = run_cli("lab", "down", "--run-dir", str(tmp_path))
    assert down.returncode == 0, down.stdout + down.stderr
    assert nothing_left(lab_config, tmp_path) == []
    again_down = run_cli("lab", "down", "--run-dir", str(tmp_path))
    assert again_down.returncode == 0, again_down.stderr
    assert "nothing was left" in again_down.stderr
    after = run_cli("lab", "status", "--run-dir", str(tmp_path), "--json")
    assert after.returncode == 1 and json.loads(after.stdout)["phase"] == "down"


@pytest.mark.parametrize("state_file", ["kept", "deleted"])
def test_down_after_sigkilled_up_leaves_nothing(
    tmp_path: Path,
    lab_config: LabConfig,
    state_file: str,
    run_cli: Callable[..., subprocess.CompletedProcess[str]],
    config_args: Callable[[LabConfig], list[str]],
    nothing_left: Leftovers,
    cleanup_lab: Callable[[LabConfig, Path], None],
) -> None:
    cleanup_lab(lab_config, tmp_path)
    proc = _popen_up(tmp_path, config_args(lab_config))
    try:
        _wait_for_started_services(tmp_path, lab_config, count=3)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert nothing_left(lab_config, tmp_path), "the test killed lab up too late or too early"
    if state_file == "deleted":
        # Without lab.json, down finds everything by name prefix and environment marker.
        (tmp_path / "lab.json").unlink()
    down = run_cli("lab", "down", "--run-dir", str(tmp_path), *config_args(lab_config))
    assert down.returncode == 0, down.stdout + down.stderr
    assert nothing_left(lab_config, tmp_path) == []


def test_ctrl_c_during_up_removes_what_was_created(
    tmp_path: Path,
    lab_config: LabConfig,
    config_args: Callable[[LabConfig], list[str]],
    nothing_left: Leftovers,
    cleanup_lab: Callable[[LabConfig, Path], None],
) -> None:
    cleanup_lab(lab_config, tmp_path)
    proc = _popen_up(tmp_path, config_args(lab_config))
    _wait_for_started_services(tmp_path, lab_config, count=2)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "removing what was created" in output
    assert "Traceback" not in output
    assert nothing_left(lab_config, tmp_path) == []
    assert Lab(tmp_path).state.phase == "failed"


def test_up_whose_output_pipe_closes_records_why_and_leaves_nothing(
    tmp_path: Path,
    lab_config: LabConfig,
    config_args: Callable[[LabConfig], list[str]],
    nothing_left: Leftovers,
    cleanup_lab: Callable[[LabConfig, Path], None],
) -> None:
    cleanup_lab(lab_config, tmp_path)
    proc = _popen_up(tmp_path, config_args(lab_config))
    assert proc.stdout is not None
    proc.stdout.close()  # like `lab up | head -0`: the reader is gone
    assert proc.wait(timeout=120) != 0
    state = Lab(tmp_path).state
    assert state.phase == "failed"
    assert state.error is not None and "pipe" in state.error, state.error
    assert nothing_left(lab_config, tmp_path) == []


def test_taken_port_fails_clearly_and_creates_nothing(
    tmp_path: Path,
    lab_config: LabConfig,
    run_cli: Callable[..., subprocess.CompletedProcess[str]],
    config_args: Callable[[LabConfig], list[str]],
    nothing_left: Leftovers,
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", lab_config.prometheus_port))
        listener.listen()
        up = run_cli("lab", "up", "--run-dir", str(tmp_path), *config_args(lab_config))
    assert up.returncode == 2, up.stdout + up.stderr
    assert f"127.0.0.1:{lab_config.prometheus_port} for prometheus is already in use" in up.stderr
    assert "--prometheus-port" in up.stderr
    assert "Traceback" not in up.stderr
    assert nothing_left(lab_config, tmp_path) == []


def test_service_failing_during_start_is_named_and_everything_removed(
    tmp_path: Path,
    lab_config: LabConfig,
    nothing_left: Leftovers,
    cleanup_lab: Callable[[LabConfig, Path], None],
) -> None:
    cleanup_lab(lab_config, tmp_path)
    squatter = socket.socket()
    events: list[ProgressEvent] = []

    def take_port_before_prometheus(event: ProgressEvent) -> None:
        # Preflight found the port free; take it just before Prometheus binds it.
        events.append(event)
        if event.kind == "start" and event.subject == "prometheus":
            squatter.bind(("127.0.0.1", lab_config.prometheus_port))
            squatter.listen()

    try:
        with pytest.raises(ServiceFailedError) as failure:
            Lab(tmp_path).up(lab_config, progress=take_port_before_prometheus)
    finally:
        squatter.close()
    assert failure.value.service == "prometheus"
    assert failure.value.log_file == tmp_path / "logs" / "prometheus.log"
    assert "prometheus exited with code" in str(failure.value)
    assert "address already in use" in str(failure.value)
    assert any(e.kind == "remove" for e in events)
    assert nothing_left(lab_config, tmp_path) == []
    state = Lab(tmp_path).state
    assert state.phase == "failed" and "prometheus" in (state.error or "")


def test_up_without_privileges_says_why(
    tmp_path: Path,
    lab_config: LabConfig,
    config_args: Callable[[LabConfig], list[str]],
    nothing_left: Leftovers,
) -> None:
    stormwatch = str(Path(sys.executable).with_name("stormwatch"))
    out = subprocess.run(
        [
            "setpriv",
            "--bounding-set=-net_admin,-sys_admin",
            stormwatch,
            "lab",
            "up",
            "--run-dir",
            str(tmp_path),
            *config_args(lab_config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN)" in out.stderr
    assert "network namespaces" in out.stderr
    assert "Traceback" not in out.stderr
    assert nothing_left(lab_config, tmp_path) == []
