"""``lab up`` starts the lab's Slurm cluster (munged, slurmctld, one slurmd per node
namespace), ``lab status`` shows it, ``lab down`` leaves none of it, also after a crash.

Runs on its own names (prefix ``swls``, 10.218.0.0/24, free ports), so it needs no
``/tmp/stormwatch-e2e.lock``, and in a 0755 run folder under /tmp (pytest's are 0700; the
lab's munge folder is under /run anyway, this keeps the run folder readable for jobs).
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from stormwatch.lab import Lab, LabConfig
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.slurm import lab_cluster
from stormwatch.lab.slurm.lab_cluster import runtime_dir
from stormwatch.lab.state import StateStore

pytestmark = [pytest.mark.e2e, pytest.mark.root]


Leftovers = Callable[[LabConfig, Path], list[str]]
Cli = Callable[..., subprocess.CompletedProcess[str]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config() -> LabConfig:
    ports: set[int] = set()
    while len(ports) < 4:
        ports.add(_free_port())
    prometheus, alertmanager, responder, slurmctld = sorted(ports)
    return LabConfig(
        prefix="swls",
        subnet=ipaddress.IPv4Network("10.218.0.0/24"),
        prometheus_port=prometheus,
        alertmanager_port=alertmanager,
        responder_port=responder,
        slurmctld_port=slurmctld,
    )


@pytest.fixture
def run_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="swls-run-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _slurm_leftovers(config: LabConfig, run_dir: Path) -> list[str]:
    """Slurm daemons, step daemons, runtime folder and node mounts of the lab."""
    found = lab_cluster(run_dir, config).leftovers()
    if runtime_dir(config).exists():
        found.append(str(runtime_dir(config)))
    marker = str(RunPaths.of(run_dir).slurm_dir)
    for pid in psutil.pids():
        try:
            if marker in Path(f"/proc/{pid}/mountinfo").read_text():
                found.append(f"mount in pid {pid}")
        except OSError:
            continue
    return found


@pytest.fixture
def config(
    run_dir: Path, lab_possible: None, cli: Cli, nothing_left: Leftovers
) -> Iterator[LabConfig]:
    config = _config()
    yield config
    if nothing_left(config, run_dir) or _slurm_leftovers(config, run_dir):
        cli("down", config)


@pytest.fixture
def cli(run_cli: Cli, config_args: Callable[[LabConfig], list[str]], run_dir: Path) -> Cli:
    """``cli(command, config, *more)``: ``stormwatch lab COMMAND --run-dir ... <config>``."""

    def run(command: str, config: LabConfig, *more: str) -> subprocess.CompletedProcess[str]:
        args = config_args(config) if command in ("up", "down") else []
        return run_cli("lab", command, "--run-dir", str(run_dir), *args, *more)

    return run


def test_lab_up_runs_slurm_idle_on_every_node_and_down_leaves_none_of_it(
    config: LabConfig, run_dir: Path, cli: Cli, nothing_left: Leftovers
) -> None:
    started = time.monotonic()
    up = cli("up", config)
    print(f"lab up: {time.monotonic() - started:.1f} s")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "Slurm nodes idle after" in up.stderr

    state = Lab(run_dir).state
    assert state.slurm is not None and state.slurm.controller_port == config.slurmctld_port
    assert state.slurm.nodes == ["node0", "node1", "node2"]
    assert Path(state.slurm.conf).is_file()

    status = cli("status", config, "--json")
    report = json.loads(status.stdout)
    assert status.returncode == 0 and report["healthy"] is True, status.stdout + status.stderr
    assert report["slurm"]["nodes"] == {"node0": "IDLE", "node1": "IDLE", "node2": "IDLE"}

    down = cli("down", config)
    assert down.returncode == 0, down.stdout + down.stderr
    assert nothing_left(config, run_dir) == []
    assert _slurm_leftovers(config, run_dir) == []
    assert StateStore(RunPaths.of(run_dir)).require().slurm is None


def test_down_after_a_crash_stops_slurm_daemons_and_their_steps(
    config: LabConfig, run_dir: Path, cli: Cli, nothing_left: Leftovers
) -> None:
    up = cli("up", config)
    assert up.returncode == 0, up.stdout + up.stderr
    cluster = lab_cluster(run_dir, config)
    job = cluster.commands.submit(["-N2", f"--chdir={run_dir}", "--wrap", "srun sleep 300"])
    deadline = time.monotonic() + 30
    while cluster.commands.job(job).state != "RUNNING":
        assert time.monotonic() < deadline, "the job never ran"
        time.sleep(0.1)
    # A crash: lab.json is lost, and the pid files name nothing any more.
    (run_dir / "lab.json").unlink()
    for pid_file in (run_dir / "slurm").rglob("*.pid"):
        pid_file.write_text("999999\n")
    down = cli("down", config)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _slurm_leftovers(config, run_dir) == []
    assert nothing_left(config, run_dir) == []


def test_lab_up_without_slurm_starts_none(config: LabConfig, run_dir: Path, cli: Cli) -> None:
    up = cli("up", config, "--no-slurm")
    assert up.returncode == 0, up.stdout + up.stderr
    assert Lab(run_dir).state.slurm is None
    assert _slurm_leftovers(config, run_dir) == []
    assert cli("down", config).returncode == 0
